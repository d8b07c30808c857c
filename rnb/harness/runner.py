"""The generic runner: one process per (step, queue group, gpus entry).

It sets its torch thread counts (rnb.pipeline.plan decides them), loads its step's
model on its device, then loops: take a signal, copy the input tensors out of
the producer's shared slot into its own reused buffers and release the slot,
call the model, write the outputs into a free slot of its own, and signal the
next step on the queue its selector picks.  The final step counts finished items
and raises the termination flag at the target.  Every move is stamped on the
item's time card.
"""
from __future__ import annotations

import contextlib
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from rnb.harness.control import POLL_S, LocalBuffers, Plumbing, SharedSlot, Signal, Termination
from rnb.harness.child import child_main
from rnb.pipeline.dotted import load_object
from rnb.harness.timecard import TimeCard, as_cards
from selector import RoundRobinSelector


@dataclass(frozen=True)
class RunnerSpec:
    """Everything one runner needs, decided by the main process before spawning."""

    name: str
    step: int
    group: int
    instance: int
    device: str                       # "cpu" or "cuda:N"
    model: str                        # dotted class path
    model_kwargs: Mapping[str, Any]
    selector: str | None              # dotted class path; None = round robin
    in_queue: int | None              # None = the request queue (step 0)
    out_queues: tuple[int, ...]       # empty for the final step
    num_segments: int
    target: int                       # -v: items the final step must finish
    slots: tuple[SharedSlot, ...]     # this runner's own output slots
    sources: Mapping[tuple[int, int], tuple[SharedSlot, ...]]  # (group, instance) of step-1 -> slots
    selector_kwargs: Mapping[str, Any] = field(default_factory=dict)  # keywords of the selector's constructor
    threads: int | None = None        # torch intra-op and inter-op threads; None = torch's default


def main(spec: RunnerSpec, plumbing: Plumbing) -> None:
    """Process entry point."""
    device = torch.device(spec.device)
    child_main(spec.name, plumbing, lambda: Runner(spec, plumbing).run(), device)


class Runner:
    def __init__(self, spec: RunnerSpec, plumbing: Plumbing) -> None:
        self.spec = spec
        self.plumbing = plumbing
        if spec.threads is not None:
            # Before the model loads: inter-op threads can only be set before any parallel work.
            torch.set_num_threads(spec.threads)
            torch.set_num_interop_threads(spec.threads)
        self.device = torch.device(spec.device)
        self.inputs = LocalBuffers(self.device)
        self.stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.stream = torch.cuda.Stream(self.device)
        self.is_final = not spec.out_queues
        self.inbox = plumbing.requests if spec.in_queue is None else plumbing.step_queues[spec.step - 1][spec.in_queue]
        self.outboxes = [plumbing.step_queues[spec.step][q] for q in spec.out_queues]
        self._next_slot = 0
        self._outputs = 0  # the model's outputs so far: each is one batch of the route
        with self._on_stream():
            self.model = load_object(spec.model)(self.device, **spec.model_kwargs)
        selector_class = load_object(spec.selector) if spec.selector else RoundRobinSelector
        self.selector = None if self.is_final else selector_class(len(self.outboxes), **spec.selector_kwargs)

    def _on_stream(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def run(self) -> None:
        notes = [str(note) for note in getattr(self.model, "notes", ())]
        self.plumbing.status.put(("ready", self.spec.name, notes))
        if not self.plumbing.wait_for_start():
            return
        with self._on_stream():
            while not self.plumbing.flag.is_set:
                try:
                    message = self.inbox.get(timeout=POLL_S)
                except queue.Empty:
                    self.flush()
                    continue
                self.handle(message)

    def handle(self, message: Any) -> None:
        k = self.spec.step
        arrived = time.time()
        if self.spec.in_queue is None:
            payload, card = message
            tensors, non_tensors, time_card = (), {"request": payload}, card
        else:
            signal: Signal = message
            slot = self.spec.sources[(signal.group, signal.instance)][signal.slot]
            tensors = slot.read(self.device, self.inputs)
            self._sync()
            slot.free.set()
            non_tensors, time_card = signal.non_tensors, signal.time_card
        started = time.time()
        for card in as_cards(time_card):
            card.record(f"runner{k}_start", arrived)
            card.record(f"inference{k}_start", started)
            card.set_device(k, self.spec.device)
            card.set_replica(k, self.spec.group, self.spec.instance)
        self.emit(*self.model(tensors, non_tensors, time_card))

    def flush(self) -> None:
        """While the input is idle, let a holding model (a batcher) hand over what it holds."""
        flush = getattr(self.model, "flush", None)
        if flush is not None:
            self.emit(*flush())

    def emit(self, tensors: Any, non_tensors: dict, time_card: Any) -> None:
        """Pass a model's result on (or count it at the final step); a None time card means nothing yet."""
        if time_card is None:
            return
        k = self.spec.step
        finished = time.time()
        batch = as_cards(time_card)
        for card in batch:
            card.record(f"inference{k}_finish", finished)
            card.set_batch(k, self._outputs, len(batch))
        self._outputs += 1
        if self.is_final:
            self.count(as_cards(time_card))
        else:
            self.publish(tuple(tensors), non_tensors, time_card)

    def publish(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> None:
        """Write each segment into a free slot and signal it; the queue carries no tensor."""
        n = self.spec.num_segments
        if n == 1:
            segments = [(tensors, time_card)]
        else:
            pieces = list(zip(*(torch.tensor_split(t, n) for t in tensors))) or [()] * n
            forks = [card.fork(n) for card in as_cards(time_card)]
            cards = [forks[0][i] if isinstance(time_card, TimeCard) else tuple(f[i] for f in forks) for i in range(n)]
            segments = list(zip(pieces, cards))
        for segment_tensors, segment_card in segments:
            box = self.selector.select(segment_tensors, non_tensors, segment_card)
            for card in as_cards(segment_card):
                card.set_out_queue(self.spec.step, self.spec.out_queues[box])
            index = self.acquire_slot()
            if index is None:
                return
            # Separates waiting for a free slot (back-pressure from the next step) from the copy itself.
            for card in as_cards(segment_card):
                card.record(f"slot{self.spec.step}_acquired")
            self.spec.slots[index].write(segment_tensors, f"{self.spec.name} ({self.spec.model})")
            self._sync()
            for card in as_cards(segment_card):
                card.record(f"runner{self.spec.step}_finish")
            signal = Signal(self.spec.step, self.spec.group, self.spec.instance, index, non_tensors, segment_card)
            try:
                self.outboxes[box].put_nowait(signal)
            except queue.Full:
                self.spec.slots[index].free.set()
                self.plumbing.flag.raise_(Termination.INTER_STEP_QUEUE_FULL)
                return

    def acquire_slot(self) -> int | None:
        """The next free output slot, taken; None if the job ends while every slot is busy."""
        slots = self.spec.slots
        while not self.plumbing.flag.is_set:
            for offset in range(len(slots)):
                index = (self._next_slot + offset) % len(slots)
                if slots[index].free.is_set():
                    slots[index].free.clear()
                    self._next_slot = (index + 1) % len(slots)
                    return index
            slots[self._next_slot].free.wait(POLL_S)
        return None

    def count(self, cards: tuple[TimeCard, ...]) -> None:
        """Final step: count finished items, ship their cards to main, stop at the target."""
        for card in cards:
            if card.segments:
                raise ValueError(
                    f"{self.spec.name}: item {card.item_id} reached the final step as an unmerged segment; "
                    "a step after one with num_segments > 1 must merge segments (an aggregator)")
        finished = self.plumbing.finished
        with finished.get_lock():
            accepted = cards[: max(0, self.spec.target - finished.value)]
            finished.value += len(accepted)
            reached = finished.value >= self.spec.target
        now = time.time()
        for card in accepted:
            card.record(f"runner{self.spec.step}_finish", now)
        if accepted:
            self.plumbing.results.put(accepted)
        if self.plumbing.in_flight is not None:
            for _ in cards:
                self.plumbing.in_flight.release()
        if reached:
            self.plumbing.flag.raise_(Termination.TARGET_REACHED)
