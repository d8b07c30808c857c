"""The Ray engine's side on the cluster: the job's actors and the transports the shared loops run on.

    JobControl (on the driver's node): the termination flag, the finished count, what the driver collects
    ClientActor ──push(Request)──▶ RunnerActor, step 0 ──push(Handoff, tensors)──▶ RunnerActor, step 1 ...
                                                   final step ──finish(cards)──▶ JobControl ──halt──▶ every actor

The client and every runner run the same loops as on the local engine
(rnb.engines.client.generate, rnb.engines.runner.Runner), each in a thread
of its own async actor, while the actor's event loop takes hand-offs, the
start signal and the halt.  A hand-off is one actor call whose tensors are
an argument: Ray moves them through its object store, across nodes when the
consumer lives elsewhere.  The call returns once the consumer has taken the
item off its inbox and copied the tensors out; until then the hand-off
holds one of the producer's `num_shared_tensors` slots, as a shared slot
does on the local engine.  Of a queue's consumers, a producer hands each
item to the one with the fewest of its hand-offs still untaken, so replicas
that share an input queue share its work.
"""
from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from rnb.core.messages import Exited, Handoff, Request, Results, Status
from rnb.core.stages import StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.core.timecard import TimeCard, as_cards, now, set_clock_offset
from rnb.engines import client
from rnb.engines.buffers import LocalBuffers
from rnb.engines.participant import run_and_report
from rnb.engines.runner import Runner
from rnb.engines.transport import RESULTS_BATCH, FinishedCards, Input
from rnb.pipeline.plan import Placement

# Ray's own zero-copy path for CPU tensors: the consumer reads them straight out of the object store.
ACTOR_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


@dataclass(frozen=True)
class Whereabouts:
    """Where an actor runs: what meta.json records of each process."""

    node_id: str
    pid: int
    gpu_ids: tuple[str, ...]   # the GPUs Ray gave it (its CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class ControlState:
    """What the driver takes from JobControl at each look: the flag, and what came in since the last look."""

    reason: Termination
    raised_at: float
    statuses: tuple[Status, ...]
    cards: tuple[TimeCard, ...]


class JobControl:
    """The job's shared state on Ray (a plain actor: one call at a time, in the order each caller sent them).

    It lives on the driver's node, so the time it stamps on the flag, the
    end of the job, is on the driver's clock.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.finished = 0
        self.reason = Termination.RUNNING
        self.raised_at = 0.0
        self.statuses: list[Status] = []
        self.cards: list[TimeCard] = []
        self.members: list[Any] = []
        self.client: Any = None

    def attach(self, members: Sequence[Any], client_actor: Any) -> None:
        """The actors to halt when the job ends, and the client to tell of finished items (closed loop) or None."""
        self.members, self.client = list(members), client_actor
        if self.reason != Termination.RUNNING:
            self._halt_all()

    def stop(self, reason: Termination) -> None:
        """The first reason wins; every actor is told to halt."""
        if self.reason == Termination.RUNNING:
            self.reason, self.raised_at = Termination(reason), time.time()
            self._halt_all()

    def _halt_all(self) -> None:
        for member in self.members:
            member.halt.remote()

    def finish(self, results: Results) -> None:
        """Final step: count cards towards the target (those past it are dropped); stop at the target."""
        cards = results.cards
        accepted = cards[: max(0, self.target - self.finished)]
        self.finished += len(accepted)
        self.cards.extend(accepted)
        if self.client is not None:
            self.client.release.remote(len(cards))
        if self.finished >= self.target:
            self.stop(Termination.TARGET_REACHED)

    def report(self, status: Status) -> None:
        self.statuses.append(status)

    def collect(self) -> ControlState:
        state = ControlState(self.reason, self.raised_at, tuple(self.statuses), tuple(self.cards))
        self.statuses, self.cards = [], []
        return state


class Outstanding:
    """Hand-offs a producer sent that their consumers have not taken yet, per consumer; thread-safe.

    A hand-off's call returns when the consumer takes it, so its ObjectRef
    completing (ok or failed) is what frees it.
    """

    def __init__(self, consumers: int) -> None:
        self.counts = [0] * consumers
        self._next = 0
        self._changed = threading.Condition()

    @property
    def total(self) -> int:
        return sum(self.counts)

    def least_loaded(self, candidates: Sequence[int]) -> int:
        """The candidate with the fewest untaken hand-offs; ties go round robin."""
        with self._changed:
            fewest = min(self.counts[c] for c in candidates)
            tied = [c for c in candidates if self.counts[c] == fewest]
            self._next += 1
            return tied[self._next % len(tied)]

    def add(self, consumer: int, ref: ray.ObjectRef) -> None:
        with self._changed:
            self.counts[consumer] += 1
        ref.future().add_done_callback(lambda _: self._taken(consumer))

    def _taken(self, consumer: int) -> None:
        with self._changed:
            self.counts[consumer] -= 1
            self._changed.notify_all()

    def wait_below(self, limit: int, stopped: Callable[[], bool]) -> bool:
        """Block until fewer than `limit` are untaken; False if the job ended first."""
        with self._changed:
            while self.total >= limit:
                if stopped():
                    return False
                self._changed.wait(POLL_S)
        return not stopped()


@dataclass(frozen=True)
class RayWiring:
    """A runner's connections: the control, and the consumers of each of its out_queues (by position)."""

    control: Any
    consumers: tuple[tuple[Any, ...], ...]   # out_queues[i] -> the runner actors reading it
    num_slots: int                            # hand-offs it may have untaken at once (num_shared_tensors)


class _Member:
    """What the client and runner actors share: the start gate, the halt, and the thread their loop runs in."""

    def __init__(self, control: Any) -> None:
        # Ray warns that tensors read zero-copy must not be written to: consumers only copy them out.
        warnings.filterwarnings("ignore", message="Zero-copy tensor serialization is enabled")
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.control = control
        self.started = threading.Event()
        self.halted = threading.Event()

    async def where(self) -> Whereabouts:
        context = ray.get_runtime_context()
        return Whereabouts(context.get_node_id(), os.getpid(), tuple(str(g) for g in context.get_accelerator_ids().get("GPU", ())))

    async def clock(self) -> float:
        """This node's time, for the driver's clock-offset round trips."""
        return time.time()

    async def start(self, clock_offset_s: float) -> None:
        """Open the start gate; from now on cards are stamped on the driver's clock."""
        set_clock_offset(clock_offset_s)
        self.started.set()

    async def halt(self) -> None:
        self.halted.set()

    async def _in_thread(self, work: Callable[[], int]) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, work)


class _RayParticipant:
    """What the client's and the runners' Ray transports do alike (rnb.engines.transport.Participant)."""

    def __init__(self, member: _Member) -> None:
        self.member = member

    @property
    def stopped(self) -> bool:
        return self.member.halted.is_set()

    def stop(self, reason: Termination) -> None:
        self.member.halted.set()
        self.member.control.stop.remote(reason)

    def report(self, status: Status) -> None:
        self.member.control.report.remote(status)

    def wait_for_start(self) -> bool:
        while not self.member.started.wait(POLL_S):
            if self.stopped:
                return False
        return not self.stopped


@dataclass(frozen=True)
class _Arrival:
    message: Handoff | Request
    tensors: tuple[torch.Tensor, ...]
    taken: Callable[[], None]     # completes the producer's push call


class RunnerActor(_Member):
    """One runner: its inbox takes hand-offs while its thread runs the runner loop."""

    def __init__(self, control: Any, step: int, queue_size: int) -> None:
        super().__init__(control)
        self.step = step
        self.inbox: queue.Queue[_Arrival] = queue.Queue(queue_size)
        self.pending: set[asyncio.Future] = set()

    async def push(self, message: Handoff | Request, tensors: tuple[torch.Tensor, ...] = ()) -> None:
        """Take a hand-off into the inbox; return once the runner has taken it (or the job ended)."""
        loop = asyncio.get_running_loop()
        taken = loop.create_future()
        try:
            self.inbox.put_nowait(_Arrival(message, tensors, lambda: loop.call_soon_threadsafe(_settle, taken)))
        except queue.Full:
            self.halted.set()
            full = Termination.REQUEST_QUEUE_FULL if self.step == 0 else Termination.INTER_STEP_QUEUE_FULL
            self.control.stop.remote(full)
            return
        self.pending.add(taken)
        taken.add_done_callback(self.pending.discard)
        await taken

    async def halt(self) -> None:
        """Stop the loop and let every producer's waiting hand-off return."""
        self.halted.set()
        for taken in list(self.pending):
            _settle(taken)

    async def run(self, spec: Placement, wiring: RayWiring) -> int:
        """The runner loop, until the job ends; 0 ok, 1 failed (reported to the control as Failed)."""
        transport = RayTransport(spec, wiring, self)
        return await self._in_thread(lambda: run_and_report(
            spec.name, transport, lambda: Runner(spec, transport).run(), torch.device(spec.device)))


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class RayTransport(_RayParticipant):
    """A runner's transport (rnb.engines.transport.Transport) over actor calls and Ray's object store."""

    def __init__(self, spec: Placement, wiring: RayWiring, member: RunnerActor) -> None:
        super().__init__(member)
        self.spec = spec
        self.wiring = wiring
        self.inbox = member.inbox
        self.device = torch.device(spec.device)
        self.events = StepEvents(spec.step)
        self.inputs = LocalBuffers(torch.device(spec.input_device))
        # Each out_queue's consumers have a run of numbers of their own in `outstanding`, from first[queue].
        self.first = [sum(len(c) for c in wiring.consumers[:q]) for q in range(len(wiring.consumers))]
        self.outstanding = Outstanding(sum(len(c) for c in wiring.consumers))
        self.finished = FinishedCards(lambda results: self.member.control.finish.remote(results))

    def _sync(self) -> None:
        if self.inputs.on_cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, timeout: float) -> Input | None:
        try:
            arrival = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        arrived = now()
        message = arrival.message
        if isinstance(message, Request):
            arrival.taken()
            return Input((), {"request": message.payload}, message.card, arrived)
        # Copied out so the object store's copy can go, as a shared slot is released on the local engine.
        tensors = tuple(self.inputs.shaped(i, t).copy_(t, non_blocking=self.inputs.on_cuda)
                        for i, t in enumerate(arrival.tensors))
        self._sync()
        arrival.taken()
        return Input(tensors, message.non_tensors, message.time_card, arrived)

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> bool:
        if not self.outstanding.wait_below(self.wiring.num_slots, lambda: self.stopped):
            return False
        cards = as_cards(time_card)
        for card in cards:
            card.record(self.events.slot_acquired)
        # CUDA tensors go out through host memory (the copy waits for this runner's stream): the object
        # store holds CPU tensors.
        payload = tuple(t.to("cpu") for t in tensors)
        consumers, first = self.wiring.consumers[queue_index], self.first[queue_index]
        chosen = self.outstanding.least_loaded(range(first, first + len(consumers)))
        for card in cards:
            card.record(self.events.handed_over)
        message = Handoff(self.spec.step, self.spec.group, self.spec.instance, non_tensors, time_card)
        self.outstanding.add(chosen, consumers[chosen - first].push.remote(message, payload))
        return True

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        """Count at the JobControl, which ends the job itself at the target: always False here.

        While more items wait in the inbox, counted cards gather (up to
        RESULTS_BATCH) and go in one call, as an actor call per item costs
        both sides; with none waiting they go at once, so no card is held
        back from the count, the one that reaches the target included.
        """
        self.finished.add(cards)
        if len(self.finished) >= RESULTS_BATCH or self.inbox.empty():
            self.finished.send()
        return False

    def report(self, status: Status) -> None:
        if isinstance(status, Exited):  # a runner's last word comes after every card it counted
            self.finished.send()
        super().report(status)


class ClientActor(_Member):
    """The load generator, whose thread runs rnb.engines.client.generate."""

    def __init__(self, control: Any, concurrency: int | None) -> None:
        super().__init__(control)
        self.in_flight = threading.Semaphore(concurrency) if concurrency else None

    async def release(self, count: int) -> None:
        """Closed loop: the final step finished `count` items."""
        if self.in_flight is not None:
            self.in_flight.release(count)

    async def run(self, spec: client.ClientSpec, step0: tuple[Any, ...], queue_size: int) -> int:
        transport = RayClientTransport(self, step0, queue_size)
        return await self._in_thread(lambda: run_and_report("client", transport, lambda: client.generate(spec, transport)))


class RayClientTransport(_RayParticipant):
    """The client's transport (rnb.engines.transport.ClientTransport): requests as calls to step-0 runners.

    The request queue of the local engine holds at most -qs requests; here
    that bound is on the requests sent but not yet taken by any step-0 runner.
    """

    def __init__(self, member: ClientActor, step0: tuple[Any, ...], queue_size: int) -> None:
        super().__init__(member)
        self.in_flight = member.in_flight
        self.step0 = step0
        self.queue_size = queue_size
        self.outstanding = Outstanding(len(step0))

    def wait_for_room(self) -> bool:
        if self.in_flight is not None:
            while not self.in_flight.acquire(timeout=POLL_S):
                if self.stopped:
                    return False
        return not self.stopped

    def submit(self, request: Request) -> bool:
        if self.outstanding.total >= self.queue_size:
            self.stop(Termination.REQUEST_QUEUE_FULL)
            return False
        chosen = self.outstanding.least_loaded(range(len(self.step0)))
        self.outstanding.add(chosen, self.step0[chosen].push.remote(request))
        return True
