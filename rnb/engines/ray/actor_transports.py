"""The Ray client's transport and what every actor's transport does alike: the shared loops' side of actor calls
(rnb.engines.transport_protocols's protocols on Ray; a runner's is rnb.engines.ray.runner_transport).

Apart from the actor classes (rnb.engines.ray.actors), which import none
of this at module level: every process that holds an actor handle loads
its class, the JobControl's among them, and a class whose module imported
torch would make each of them import it (about 2 s of CPU, during which a
plain actor such as the JobControl takes no call).  The client's `run`
imports this module in its own process, which then never loads torch: the
client sends requests, never tensors.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rnb.core.messages import Failed, Request, Status
from rnb.core.termination import POLL_S, Termination
from rnb.engines.ray.handoffs import Courier, Outbox, Parcel

if TYPE_CHECKING:
    from rnb.engines.ray.actors import ClientActor, _Member


class RayParticipant:
    """What the client's and the runners' Ray transports do alike (rnb.engines.transport_protocols.Participant).

    Its reports and its stop go through the courier, behind the hand-offs
    and cards posted before them: a Failed arrives before the stop it
    causes, an Exited after every card counted.
    """

    def __init__(self, member: _Member, name: str) -> None:
        self.member = member
        self.name = name
        self.courier = Courier(self._call_failed)

    @property
    def stopped(self) -> bool:
        return self.member.halted.is_set()

    def stop(self, reason: Termination) -> None:
        self.member.halted.set()
        self.courier.post(lambda: self.member.control.stop.remote(reason))

    def report(self, status: Status) -> None:
        self.courier.post(lambda: self.member.control.report.remote(status))

    def _call_failed(self, error: BaseException) -> None:
        """A call the courier could not make (on its thread): this participant failed, and the job ends."""
        self.member.halted.set()
        self.member.control.report.remote(Failed(self.name, f"{type(error).__name__}: {error}"))
        self.member.control.stop.remote(Termination.PROCESS_FAILED)

    def wait_for_start(self) -> bool:
        while not self.member.started.wait(POLL_S):
            if self.stopped:
                return False
        return not self.stopped


class RayClientTransport(RayParticipant):
    """The client's transport (rnb.engines.transport_protocols.ClientTransport): requests as calls to step-0 runners.

    The request queue of the local engine holds at most -qs requests; here
    that bound is on the requests sent but not yet taken by any step-0 runner.
    """

    def __init__(self, member: ClientActor, step0: tuple[Any, ...], queue_size: int) -> None:
        super().__init__(member, "client")
        self.in_flight = member.in_flight
        self.waits = member.waits
        self.queue_size = queue_size
        self.outbox = Outbox(len(step0), lambda c, parcels: step0[c].push.remote(parcels), self.courier)

    def wait_for_room(self) -> bool:
        if self.in_flight is not None:
            while not self.in_flight.acquire(timeout=POLL_S):
                if self.stopped:
                    return False
        return not self.stopped

    def submit(self, request: Request) -> bool:
        if self.outbox.total >= self.queue_size:
            self.stop(Termination.REQUEST_QUEUE_FULL)
            return False
        chosen = self.outbox.least_loaded(range(len(self.outbox.counts)))
        self.outbox.put(chosen, Parcel.of(request))
        return True

    def waiting(self) -> int:
        return self.outbox.total

    def drop(self, count: int) -> bool:
        self.courier.post(lambda: self.member.control.drop.remote(count))
        return self.stopped
