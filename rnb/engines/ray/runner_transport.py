"""A Ray runner's transport: its inbox of hand-offs, its outputs handed to the next step's actors, its cards counted.

Apart from the client's (rnb.engines.ray.actor_transports), which must not
import torch; a runner's `run` imports this module in its own process.
"""
from __future__ import annotations

import queue
from typing import TYPE_CHECKING

import torch

from rnb.core.messages import Exited, Handoff, Request, Status
from rnb.core.model import NonTensors
from rnb.core.stages import StepEvents
from rnb.core.timecard import Cards, TimeCard, as_cards, now
from rnb.engines.buffers import LocalBuffers
from rnb.engines.ray.actor_transports import RayParticipant
from rnb.engines.ray.handoffs import Outbox, Parcel
from rnb.engines.streams import step_zero_non_tensors
from rnb.engines.transport_protocols import RESULTS_BATCH, FinishedCards, Input
from rnb.pipeline.plan import Placement

if TYPE_CHECKING:
    from rnb.engines.ray.actors import RayWiring, RunnerActor


class RayTransport(RayParticipant):
    """A runner's transport (rnb.engines.transport_protocols.Transport) over actor calls and Ray's object store."""

    def __init__(self, spec: Placement, wiring: RayWiring, member: RunnerActor) -> None:
        super().__init__(member, spec.name)
        self.spec = spec
        self.wiring = wiring
        self.inbox = member.inbox
        self.device = torch.device(spec.device)
        self.events = StepEvents(spec.step)
        self.inputs = LocalBuffers(torch.device(spec.input_device))
        # Each out_queue's consumers have a run of numbers of their own in the outbox, from first[queue].
        self.first = [sum(len(c) for c in wiring.consumers[:q]) for q in range(len(wiring.consumers))]
        targets = [actor for consumers in wiring.consumers for actor in consumers]
        self.outbox = Outbox(len(targets), lambda c, parcels: targets[c].push.remote(parcels), self.courier)
        self.finished = FinishedCards(lambda results: self.courier.post(lambda: member.control.finish.remote(results)))
        assert member.progress is not None
        self.progress = member.progress

    def _sync(self) -> None:
        if self.inputs.on_cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, timeout: float) -> Input | None:
        try:
            arrival = self.inbox.get(timeout=timeout)
        except queue.Empty:
            self.finished.send()  # the input is idle: a final step sends the cards it holds
            return None
        arrived = now()
        message = arrival.parcel.opened()
        if isinstance(message, Request):
            arrival.taken()
            return Input((), step_zero_non_tensors(message), message.card, arrived)
        # Copied out so the object store's copy can go, as a shared slot is released on the local engine.
        tensors = tuple(self.inputs.shaped(i, t).copy_(t, non_blocking=self.inputs.on_cuda)
                        for i, t in enumerate(arrival.parcel.tensors))
        self._sync()
        arrival.taken()
        return Input(tensors, message.non_tensors, message.time_card, arrived)

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: NonTensors, time_card: Cards) -> bool:
        if not self.outbox.wait_below(self.wiring.num_slots, lambda: self.stopped):
            return False
        cards = as_cards(time_card)
        for card in cards:
            card.record(self.events.slot_acquired)
        # The producer's own copies (Parcel): CUDA tensors go out through host memory (the copy waits for this
        # runner's stream), as the object store holds CPU tensors; a CPU output may be the model's buffer.
        payload = tuple(t.clone() if t.device.type == "cpu" else t.to("cpu") for t in tensors)
        consumers, first = self.wiring.consumers[queue_index], self.first[queue_index]
        chosen = self.outbox.least_loaded(range(first, first + len(consumers)))
        for card in cards:
            card.record(self.events.handed_over)
        message = Handoff(self.spec.step, self.spec.group, self.spec.instance, non_tensors, time_card)
        self.outbox.put(chosen, Parcel.of(message, payload))
        return True

    def complete(self, cards: tuple[TimeCard, ...]) -> None:
        """Nothing: a Ray job has no LoadGen client (rnb.engines.registry says why)."""

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        """Count at the JobControl, which ends the job itself at the target: always False here.

        Counted cards gather and go in one call once RESULTS_BATCH are held
        or the oldest has waited RESULTS_WAIT_S (FinishedCards), as a call
        per item would cost as much as a hop; the JobControl dates the end
        by the cards' own count, not by their arrival.  A closed loop's
        client waits for each count to send its next request, so there
        they go as soon as the input is empty.
        """
        self.finished.add(cards)
        if len(self.finished) >= RESULTS_BATCH or (self.wiring.count_at_once and self.inbox.empty()):
            self.finished.send()
        return False

    def report(self, status: Status) -> None:
        if isinstance(status, Exited):  # a runner's last word comes after every card it counted
            self.finished.send()
        super().report(status)
