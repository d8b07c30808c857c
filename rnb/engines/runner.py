"""The runner loop every step runs, whatever the engine: one runner per (step, queue group, gpus entry).

It sets its torch thread counts (rnb.pipeline.plan decides them), loads its
step's model on its device (on its own CUDA stream for a GPU), then loops:
take an input from its transport, call the model, wait for the device work
the call queued (rnb.core.device), and hand each output on to the output
queue its selector picks, split into segments if the step says so.  The
final step counts finished items instead, and ends the job at the target.
Every move is stamped on the item's time card.

What the loop needs from the engine (inputs, outputs, the start barrier, the
termination flag) goes through a `Transport` (rnb.engines.transport_protocols); the
local engine's is `rnb.engines.local.shared_memory_transport.LocalTransport`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from rnb.core.device import CudaQueue, DeviceMark, DeviceQueue
from rnb.core.messages import Ready
from rnb.core.model import (
    Cards,
    Flushes,
    HasDeviceQueue,
    HasNotes,
    NonTensors,
    Selector,
    SelectorClass,
    StepModelClass,
    StepOutput,
    Tensors,
)
from rnb.core.termination import POLL_S, Termination
from rnb.core.timecard import TimeCard, as_cards, now
from rnb.engines.transport_protocols import Input, Stamps, Transport
from rnb.load import DEADLINE_FIELD, LATE_FIELD
from rnb.pipeline.dotted import load_object
from rnb.pipeline.gpus import check_device_uuid
from rnb.pipeline.plan import Placement
from selector import RoundRobinSelector


class Runner:
    """One runner: its placement (rnb.pipeline.plan.Placement, decided by the driver) and its engine's transport."""

    def __init__(self, spec: Placement, transport: Transport) -> None:
        self.spec = spec
        self.transport = transport
        self.progress = transport.progress  # how far it has got, for the driver's stall watch (rnb.core.progress)
        self.events = Stamps.of(spec.step)
        if spec.threads is not None:
            # Before the model loads: inter-op threads can only be set before any parallel work.
            torch.set_num_threads(spec.threads)
            torch.set_num_interop_threads(spec.threads)
        self.device = torch.device(spec.device)
        self._outputs = 0  # the model's outputs so far: each is one batch of the route
        self.stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if spec.device_uuid:  # the GPU checked free is the one this runner computes on
                check_device_uuid(self.device.index or 0, spec.device_uuid, spec.name)
            self.stream = torch.cuda.Stream(self.device)
        with self.on_stream():
            model_class: StepModelClass = load_object(spec.model)
            self.model = model_class(self.device, **spec.model_kwargs)
        self.work = self._device_queue()
        selector_class: SelectorClass = load_object(spec.selector) if spec.selector else RoundRobinSelector
        self.selector: Selector | None = (None if spec.is_final
                                          else selector_class(len(spec.out_queues), **spec.selector_kwargs))

    def _device_queue(self) -> DeviceQueue | None:
        """What the loop waits on before it stamps a finish: the model's own device, the runner's CUDA stream, or none."""
        if isinstance(self.model, HasDeviceQueue):
            return self.model.device_queue
        return CudaQueue(self.stream) if self.stream is not None else None

    def on_stream(self) -> contextlib.AbstractContextManager[object]:
        """Run on this runner's own CUDA stream (nothing on the CPU).

        Its own stream keeps the runner's copies and kernels in one order and
        lets the loop wait for exactly its work.  Replicas in other processes
        on the same GPU do not overlap their kernels through it: without MPS
        the GPU time-slices between processes' contexts (only copy engines
        and NVDEC work beside the kernels).
        """
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def run(self) -> None:
        notes = tuple(str(note) for note in self.model.notes) if isinstance(self.model, HasNotes) else ()
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
        cards = as_cards(item.time_card)
        self.progress.took(cards[0].item_id, item.arrived)
        for card in cards:
            card.record(self.events.arrived, item.arrived)
            card.record(self.events.started, started)
            card.set_device(self.spec.step, self.spec.device)
            card.set_replica(self.spec.step, self.spec.group, self.spec.instance)
        began = self.work.mark() if self.work is not None else None
        self.progress.calling(started)
        self.emit(StepOutput(*self.model(item.tensors, item.non_tensors, item.time_card)), began, took_item=True)

    def flush(self) -> None:
        """While the input is idle, let a holding model (a batcher) hand over what it holds.

        What it hands over is stamped with when this call began: the step's
        own work on it starts there, not when its items arrived (its busy
        fraction, rnb.analysis.utilisation, counts the wait for company out).
        """
        if isinstance(self.model, Flushes):
            called = now()
            self.progress.calling(called)
            output = StepOutput(*self.model.flush())
            if output.time_card is not None:
                for card in as_cards(output.time_card):
                    card.record(self.events.flushed, called)
            self.emit(output, None, took_item=False)

    def emit(self, output: StepOutput, began: DeviceMark | None, took_item: bool) -> None:
        """Pass a model's result on (or count it at the final step) once its device work is done.

        A None time card means nothing yet.  The finish is stamped when the
        work the call queued has completed, not when the call returned: on
        a GPU that is when the kernels ran.  With a mark from before the
        call, the device's own measure of it is kept as `device_ms{k}`.
        The call's length counts toward the slowest the stall watch knows
        of if it took an item or handed something on.  The final step tells
        the client its items are done (Transport.complete) before anything
        else, with their hand-over stamped just before.
        """
        if output.time_card is None:
            self.progress.called(now() if took_item else None)
            return
        device_ms = None
        if self.work is not None:
            done = self.work.mark()
            done.wait()   # polls: a device that never finishes leaves the runner using no CPU (rnb.core.device)
            device_ms = done.ms_since(began) if began is not None else None
        finished = now()
        batch = as_cards(output.time_card)
        counted = finished
        if self.spec.is_final:   # complete first, so that a client timing the item (LoadGen) waits for no bookkeeping
            self._check_merged(batch)
            counted = now()      # stamped before the client hears of it: the client's latency holds the card's
            self.transport.complete(batch)
        self.progress.called(finished)
        for card in batch:
            card.record(self.events.finished, finished)
            card.set_batch(self.spec.step, self._outputs, len(batch))
            if device_ms is not None:
                card.set_field(self.events.device_ms, device_ms)
        self._outputs += 1
        if self.spec.is_final:
            self.count(batch, counted)
        elif not self.publish(tuple(output.tensors), output.non_tensors, _card_or_batch(output.time_card)):
            return
        self.progress.passed(len(batch))

    def publish(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> bool:
        """Hand each segment to the output queue the selector picks; False if the job ended meanwhile."""
        assert self.selector is not None  # a step that publishes is not the final one
        for segment_tensors, segment_card in self.segments(tensors, time_card):
            box = self.selector.select(segment_tensors, non_tensors, segment_card)
            for card in as_cards(segment_card):
                card.set_out_queue(self.spec.step, self.spec.out_queues[box])
            if not self.transport.send(box, segment_tensors, non_tensors, segment_card):
                return False
        return True

    def segments(self, tensors: Tensors, time_card: Cards) -> Iterator[tuple[Tensors, Cards]]:
        """The output split along its first dimension into num_segments pieces, each with forked cards."""
        n = self.spec.num_segments
        if n == 1:
            yield tensors, time_card
            return
        pieces: list[Tensors] = list(zip(*(torch.tensor_split(t, n) for t in tensors))) or [()] * n
        forks = [card.fork(n) for card in as_cards(time_card)]
        for i, piece in enumerate(pieces):
            yield piece, forks[0][i] if isinstance(time_card, TimeCard) else tuple(f[i] for f in forks)

    def _check_merged(self, cards: tuple[TimeCard, ...]) -> None:
        for card in cards:
            if card.segments:
                raise ValueError(
                    f"{self.spec.name}: item {card.item_id} reached the final step as an unmerged segment; "
                    "a step after one with num_segments > 1 must merge segments (an aggregator)")

    def count(self, cards: tuple[TimeCard, ...], counted: float) -> None:
        """Final step: count finished items handed over at `counted`, ship their cards to main, stop at the target."""
        for card in cards:
            card.record(self.events.handed_over, counted)
            deadline = card.fields.get(DEADLINE_FIELD)
            if isinstance(deadline, float):   # a stream's frame (rnb.load.Streams)
                card.set_field(LATE_FIELD, counted > deadline)
        if self.transport.finish(cards):
            self.transport.stop(Termination.TARGET_REACHED)


def _card_or_batch(time_card: Cards | Sequence[TimeCard]) -> Cards:
    """A model's card as the harness passes it on: one card, or a batch's cards as a tuple."""
    return time_card if isinstance(time_card, TimeCard) else tuple(time_card)
