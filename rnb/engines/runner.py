"""The runner loop every step runs, whatever the engine: one runner per (step, queue group, gpus entry).

It sets its torch thread counts (rnb.pipeline.plan decides them), loads its
step's model on its device (on its own CUDA stream for a GPU), then loops:
take an input from its transport, call the model, and hand each output on
to the output queue its selector picks, split into segments if the step
says so.  The final step counts finished items instead, and ends the job at
the target.  Every move is stamped on the item's time card.

What the loop needs from the engine (inputs, outputs, the start barrier, the
termination flag) goes through a `Transport` (rnb.engines.transport); the
local engine's is `rnb.engines.local.transport.LocalTransport`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rnb.core.messages import Ready
from rnb.core.stages import StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.core.timecard import TimeCard, as_cards, now
from rnb.engines.transport import Input, Transport
from rnb.pipeline.dotted import load_object
from rnb.pipeline.plan import Placement
from selector import RoundRobinSelector


@dataclass(frozen=True)
class RunnerSpec:
    """Everything one runner needs to know about its step, decided by the main process before it starts."""

    name: str
    step: int
    group: int
    instance: int
    device: str                       # "cpu" or "cuda:N"
    model: str                        # dotted class path
    model_kwargs: Mapping[str, Any]
    in_queue: int | None              # None = the request queue (step 0)
    out_queues: tuple[int, ...]       # empty for the final step
    target: int                       # -v: items the final step must finish
    selector: str | None = None       # dotted class path; None = round robin
    selector_kwargs: Mapping[str, Any] = field(default_factory=dict)  # keywords of the selector's constructor
    num_segments: int = 1
    threads: int | None = None        # torch intra-op and inter-op threads; None = torch's default
    input_device: str = ""            # where inputs are delivered; "" = `device` (rnb.pipeline.plan.host_side)

    @staticmethod
    def from_placement(placement: Placement, target: int) -> RunnerSpec:
        return RunnerSpec(
            name=placement.name, step=placement.step, group=placement.group, instance=placement.instance,
            device=placement.device, model=placement.model, model_kwargs=placement.model_kwargs,
            in_queue=placement.in_queue, out_queues=placement.out_queues, target=target,
            selector=placement.selector, selector_kwargs=placement.selector_kwargs,
            num_segments=placement.num_segments, threads=placement.threads, input_device=placement.input_device,
        )

    @property
    def is_final(self) -> bool:
        return not self.out_queues


class Runner:
    def __init__(self, spec: RunnerSpec, transport: Transport) -> None:
        self.spec = spec
        self.transport = transport
        self.events = StepEvents(spec.step)
        if spec.threads is not None:
            # Before the model loads: inter-op threads can only be set before any parallel work.
            torch.set_num_threads(spec.threads)
            torch.set_num_interop_threads(spec.threads)
        self.device = torch.device(spec.device)
        self._outputs = 0  # the model's outputs so far: each is one batch of the route
        self.stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.stream = torch.cuda.Stream(self.device)
        with self.on_stream():
            self.model = load_object(spec.model)(self.device, **spec.model_kwargs)
        selector_class = load_object(spec.selector) if spec.selector else RoundRobinSelector
        self.selector = None if spec.is_final else selector_class(len(spec.out_queues), **spec.selector_kwargs)

    def on_stream(self) -> contextlib.AbstractContextManager:
        """Run on this runner's own CUDA stream (nothing on the CPU), so replicas on one GPU overlap."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def run(self) -> None:
        notes = tuple(str(note) for note in getattr(self.model, "notes", ()))
        self.transport.report(Ready(self.spec.name, notes))
        if not self.transport.wait_for_start():
            return
        with self.on_stream():
            while not self.transport.stopped:
                item = self.transport.receive(POLL_S)
                if item is None:
                    self.flush()
                else:
                    self.handle(item)

    def handle(self, item: Input) -> None:
        started = now()
        for card in as_cards(item.time_card):
            card.record(self.events.arrived, item.arrived)
            card.record(self.events.started, started)
            card.set_device(self.spec.step, self.spec.device)
            card.set_replica(self.spec.step, self.spec.group, self.spec.instance)
        self.emit(*self.model(item.tensors, item.non_tensors, item.time_card))

    def flush(self) -> None:
        """While the input is idle, let a holding model (a batcher) hand over what it holds."""
        flush = getattr(self.model, "flush", None)
        if flush is not None:
            self.emit(*flush())

    def emit(self, tensors: Any, non_tensors: dict, time_card: Any) -> None:
        """Pass a model's result on (or count it at the final step); a None time card means nothing yet."""
        if time_card is None:
            return
        finished = now()
        batch = as_cards(time_card)
        for card in batch:
            card.record(self.events.finished, finished)
            card.set_batch(self.spec.step, self._outputs, len(batch))
        self._outputs += 1
        if self.spec.is_final:
            self.count(as_cards(time_card))
        else:
            self.publish(tuple(tensors), non_tensors, time_card)

    def publish(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> None:
        """Hand each segment to the output queue the selector picks; stop if the job ends meanwhile."""
        for segment_tensors, segment_card in self.segments(tensors, time_card):
            box = self.selector.select(segment_tensors, non_tensors, segment_card)
            for card in as_cards(segment_card):
                card.set_out_queue(self.spec.step, self.spec.out_queues[box])
            if not self.transport.send(box, segment_tensors, non_tensors, segment_card):
                return

    def segments(self, tensors: tuple[torch.Tensor, ...], time_card: Any) -> Iterator[tuple[tuple, Any]]:
        """The output split along its first dimension into num_segments pieces, each with forked cards."""
        n = self.spec.num_segments
        if n == 1:
            yield tensors, time_card
            return
        pieces = list(zip(*(torch.tensor_split(t, n) for t in tensors))) or [()] * n
        forks = [card.fork(n) for card in as_cards(time_card)]
        for i, piece in enumerate(pieces):
            yield piece, forks[0][i] if isinstance(time_card, TimeCard) else tuple(f[i] for f in forks)

    def count(self, cards: tuple[TimeCard, ...]) -> None:
        """Final step: count finished items, ship their cards to main, stop at the target."""
        for card in cards:
            if card.segments:
                raise ValueError(
                    f"{self.spec.name}: item {card.item_id} reached the final step as an unmerged segment; "
                    "a step after one with num_segments > 1 must merge segments (an aggregator)")
        counted = now()
        for card in cards:
            card.record(self.events.handed_over, counted)
        if self.transport.finish(cards):
            self.transport.stop(Termination.TARGET_REACHED)
