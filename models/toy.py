"""Tiny CPU models for tests and smoke runs, with switches to fail on purpose.

They exercise every path of the harness (tensor outputs, segments, merging,
failures, work that runs asynchronously on a device) in seconds and without
weights, data or a GPU.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Ge
from torch import nn

from rnb.core.device import DeviceMark
from rnb.core.model import Cards, NonTensors, StepOutput, Tensors
from rnb.core.model_keywords import TEST_HOOK, Count, Natural
from rnb.core.timecard import SegmentKey, TimeCard, as_cards, one_card

Ms = Annotated[float, Ge(0)]
# The fail-on-purpose keywords: checked as any keyword, never offered to users.
FailAtInit = Annotated[bool, TEST_HOOK]
AtItem = Annotated[int | None, TEST_HOOK]


@dataclass(frozen=True)
class FaultInjection:
    """The fail-on-purpose keywords every toy model accepts."""

    fail_at_init: bool = False
    fail_at_item: int | None = None     # raise on the item with this id
    exit_at_item: int | None = None     # os._exit(3) on the item with this id

    def at_init(self, model: str) -> None:
        if self.fail_at_init:
            raise RuntimeError(f"{model} failed at init on purpose (fail_at_init)")

    def at_items(self, model: str, time_card: Cards) -> None:
        ids = {card.item_id for card in as_cards(time_card)}
        if self.exit_at_item in ids:
            os._exit(3)
        if self.fail_at_item in ids:
            raise RuntimeError(f"{model} failed on item {self.fail_at_item} on purpose (fail_at_item)")


class SyntheticFrames:
    """Step 0: a deterministic (clips, 3, frames, height, width) float tensor per request.

    The values depend only on the item id, so tests can predict any output.
    """

    def __init__(self, device: torch.device, clips: Count = 2, frames: Count = 4, height: Count = 16,
                 width: Count = 16, fail_at_init: FailAtInit = False, fail_at_item: AtItem = None,
                 exit_at_item: AtItem = None) -> None:
        self.faults = FaultInjection(fail_at_init, fail_at_item, exit_at_item)
        self.faults.at_init(type(self).__name__)
        self.device = device
        self.shape = SyntheticFrames.output_shape(clips=clips, frames=frames, height=height, width=width)[0]

    @staticmethod
    def output_shape(clips: int = 2, frames: int = 4, height: int = 16, width: int = 16,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return ((clips, 3, frames, height, width),)

    @staticmethod
    def frames_for(item_id: int, shape: tuple[int, ...]) -> torch.Tensor:
        numel = 1
        for dim in shape:
            numel *= dim
        return ((torch.arange(numel, dtype=torch.float32) + item_id * 7919) % 251 / 251).reshape(shape)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        self.faults.at_items(type(self).__name__, card)
        frames = self.frames_for(card.item_id, self.shape).to(self.device)
        card.set_field("frames_decoded", self.shape[0] * self.shape[2])
        return StepOutput((frames,), {"request": non_tensors["request"]}, card)


class TinyConvNet:
    """A later step: a one-layer Conv3d classifier with seeded random weights; `clips` is accepted, not needed."""

    def __init__(self, device: torch.device, clips: Count = 2, classes: Count = 10, channels: Count = 8,
                 seed: Natural = 0, record_pid: Annotated[bool, TEST_HOOK] = False,
                 fail_at_init: FailAtInit = False, fail_at_item: AtItem = None, exit_at_item: AtItem = None) -> None:
        self.record_pid = record_pid  # lets tests see which replica handled an item
        self.faults = FaultInjection(fail_at_init, fail_at_item, exit_at_item)
        self.faults.at_init(type(self).__name__)
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.net = nn.Sequential(
            nn.Conv3d(3, channels, kernel_size=3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(channels, classes),
        ).to(device).eval()
        torch.random.set_rng_state(generator_state)

    @staticmethod
    def output_shape(clips: int = 2, classes: int = 10, input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        """(clips, classes): the clips are the input's rows (`clips` only describes them without an input)."""
        return ((clips if input_shapes is None else input_shapes[0][0], classes),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        self.faults.at_items(type(self).__name__, time_card)
        with torch.inference_mode():
            logits = self.net(tensors[0])
        if self.record_pid:
            for card in as_cards(time_card):
                card.set_field("convnet_pid", str(os.getpid()))
        return StepOutput((logits,), non_tensors, time_card)


class SegmentMerger:
    """A final-step aggregator: holds segments until all of an item's arrive, then merges them.

    It answers "no output yet" (a None time card) until an item is complete,
    which is how a real aggregator behaves.
    """

    merges_segments = True

    def __init__(self, device: torch.device, fail_at_init: FailAtInit = False, fail_at_item: AtItem = None,
                 exit_at_item: AtItem = None) -> None:
        self.faults = FaultInjection(fail_at_init, fail_at_item, exit_at_item)
        self.faults.at_init(type(self).__name__)
        self.pending: dict[SegmentKey, list[tuple[TimeCard, tuple[torch.Tensor, ...]]]] = {}

    @staticmethod
    def output_shape(**kwargs: object) -> None:
        return None

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        self.faults.at_items(type(self).__name__, card)
        if not card.segments:
            return StepOutput(tensors, non_tensors, card)
        parts = self.pending.setdefault(card.segment_key, [])
        parts.append((card, tuple(tensor.clone() for tensor in tensors)))  # inputs live only during the call
        if len(parts) < card.segments[-1][1]:
            return StepOutput((), non_tensors, None)
        del self.pending[card.segment_key]
        parts.sort(key=lambda part: part[0].segments[-1][0])
        merged = tuple(torch.cat(pieces) for pieces in zip(*(part[1] for part in parts)))
        return StepOutput(merged, non_tensors, TimeCard.merge(held for held, _ in parts))


class SleepingDevice:
    """A CPU stand-in for a GPU stream: work queued on it runs in order, each piece for its time, on a clock of its own.

    `submit` returns at once, as a kernel launch does, and books the work
    after whatever is booked already: the device is done with it at a time
    known when it is queued, as a stream's work would be done, so no thread
    stands in for the device.  The work's effect (writing the output) is
    applied only once that time has passed and someone looks (a mark's
    `query` or `wait`), so a reader that does not wait for the device reads
    unfinished data, as it would on a GPU.  `mark` (rnb.core.device.DeviceQueue)
    is a point after everything submitted so far; waiting on it sleeps until
    then, using no CPU, as a runner waiting on a CUDA event does.  Its calls
    hold no CPU: the tuner's sleeping example (config/tune-example.json) is
    worked out on that.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._busy_until = 0.0   # when the work booked so far is done, on `clock`
        self._pending: collections.deque[tuple[float, Callable[[], object]]] = collections.deque()
        self._lock = threading.Lock()   # a runner's model and its loop may look from different threads

    def submit(self, seconds: float, effect: Callable[[], object]) -> None:
        with self._lock:
            self._busy_until = max(self._busy_until, self._clock()) + seconds
            self._pending.append((self._busy_until, effect))

    def mark(self) -> SleepMark:
        with self._lock:
            return SleepMark(self, max(self._busy_until, self._clock()))

    def catch_up(self, until: float) -> None:
        """Apply, in order, the effects of the work done by `until`."""
        with self._lock:
            while self._pending and self._pending[0][0] <= until:
                self._pending.popleft()[1]()

    def now(self) -> float:
        return self._clock()


class SleepMark:
    """A point in a SleepingDevice's queue: the time the work booked before it is done (rnb.core.device.DeviceMark)."""

    def __init__(self, device: SleepingDevice, at: float) -> None:
        self.device = device
        self.at = at   # when the device reaches this mark, on its clock

    def query(self) -> bool:
        reached = self.device.now() >= self.at
        if reached:
            self.device.catch_up(self.at)
        return reached

    def wait(self) -> None:
        while (left := self.at - self.device.now()) > 0:
            time.sleep(left)
        self.device.catch_up(self.at)

    def ms_since(self, earlier: DeviceMark) -> float:
        if not isinstance(earlier, SleepMark):
            raise TypeError(f"a sleeping device's mark can only be timed against another, not a {type(earlier).__name__}")
        return (self.at - earlier.at) * 1000.0


class AsyncSleep:
    """A step whose work runs on an emulated device for `ms + ms_per_item * batch` ms; the call itself returns at once.

    It behaves as a network on a GPU does for the harness: the call queues
    the work and returns, the work completes later (on a SleepingDevice), and
    the output holds its values only then.  The runner reaches it through
    the same seam as a CUDA stream (`device_queue`), so tests of how
    asynchronous work is timed run on the CPU.  `batch` is the number of
    items in the call (its time cards).  As step 0 it makes SyntheticFrames'
    frames of the toy geometry; later it hands its input on unchanged.
    """

    def __init__(self, device: torch.device, ms: Ms = 0.0, ms_per_item: Ms = 0.0, clips: Count = 2,
                 frames: Count = 4, height: Count = 16, width: Count = 16) -> None:
        if ms < 0 or ms_per_item < 0:
            raise ValueError(f"ms and ms_per_item must be >= 0, got {ms} and {ms_per_item}")
        self.device = device
        self.seconds = ms / 1000.0
        self.seconds_per_item = ms_per_item / 1000.0
        self.shape = (clips, 3, frames, height, width)
        self.device_queue = SleepingDevice()

    @staticmethod
    def output_shape(clips: int = 2, frames: int = 4, height: int = 16, width: int = 16,
                     input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        """Its input's shapes after step 0; there, (clips, 3, frames, height, width)."""
        return input_shapes if input_shapes is not None else ((clips, 3, frames, height, width),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        cards = as_cards(time_card)
        if tensors:
            result = tensors[0].clone()  # the input's buffer is the runner's again once the call returns
        else:
            result = torch.cat([SyntheticFrames.frames_for(card.item_id, self.shape) for card in cards]).to(self.device)
        output = torch.zeros_like(result)
        self.device_queue.submit(self.seconds + self.seconds_per_item * len(cards), lambda: output.copy_(result))
        passed = non_tensors if tensors else {"request": non_tensors["request"]}
        return StepOutput((output,), passed, time_card)


class SyncSleep:
    """The plainest step there is: its call sleeps `ms` and hands its input on as it came, making no tensor.

    The counterpart of a LoadGen system under test whose worker sleeps and
    completes the sample: whatever a job of it costs beyond `ms` per item is
    the harness's (bench rows L1 and L2 hold it to that).  Without an input
    tensor (as step 0) it has no output to declare, so it can only be a
    pipeline's final step there.
    """

    def __init__(self, device: torch.device, ms: Ms = 0.0) -> None:
        self.seconds = ms / 1000.0

    @staticmethod
    def output_shape(input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     **kwargs: object) -> tuple[tuple[int, ...], ...] | None:
        """Its input's shapes; None as step 0, where it makes nothing."""
        return input_shapes

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        time.sleep(self.seconds)
        return StepOutput(tensors, non_tensors, time_card)


class CpuSpin:
    """A step that computes on the CPU for `ms + ms_per_item * batch` ms of its own thread's CPU time per call.

    CPU work of known cost, as decoding or a network on the CPU is: it
    counts CPU time, not wall time, so when more runners compute than the
    host has cores each call takes longer.  As step 0 it makes
    SyntheticFrames' frames of the toy geometry; later it hands its input on.
    """

    def __init__(self, device: torch.device, ms: Ms = 0.0, ms_per_item: Ms = 0.0, clips: Count = 2,
                 frames: Count = 4, height: Count = 16, width: Count = 16) -> None:
        self.device = device
        self.seconds = ms / 1000.0
        self.seconds_per_item = ms_per_item / 1000.0
        self.shape = (clips, 3, frames, height, width)

    @staticmethod
    def output_shape(clips: int = 2, frames: int = 4, height: int = 16, width: int = 16,
                     input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        """As AsyncSleep's: its input's shapes after step 0, there the toy geometry."""
        return AsyncSleep.output_shape(clips, frames, height, width, input_shapes)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        cards = as_cards(time_card)
        until = time.thread_time() + self.seconds + self.seconds_per_item * len(cards)
        while time.thread_time() < until:
            pass
        if tensors:
            return StepOutput((tensors[0].clone(),), non_tensors, time_card)
        frames = torch.cat([SyntheticFrames.frames_for(card.item_id, self.shape) for card in cards]).to(self.device)
        return StepOutput((frames,), {"request": non_tensors["request"]}, time_card)


class GpuSpin:
    """A step whose work is one CUDA kernel spinning `ms` milliseconds (torch.cuda._sleep); the call returns at once.

    The GPU counterpart of AsyncSleep, for checking on a real GPU that each
    step's stage times are the device's (bench/gpu_check.py): the kernel's
    length is known, its call returns when it is queued, and the runner must
    wait for it before it stamps the finish.  The spin's clock cycles per
    millisecond are measured once, with CUDA events, when the model loads,
    after WARM_UP_S of spinning: an idle GPU's clock is a fraction of its
    boost (345 against 1980 MHz on an H200), and cycles counted at the idle
    clock would make every later spin several times too short.  Of a few
    measurements the fastest counts, since runners that load at once share
    the GPU while they measure.  It hands its input on (a copy queued behind
    the kernel); as step 0 it makes SyntheticFrames' frames.
    """

    WARM_UP_S = 0.2
    CALIBRATIONS = 3

    def __init__(self, device: torch.device, ms: float = 10.0, clips: int = 2, frames: int = 4, height: int = 16,
                 width: int = 16) -> None:
        if device.type != "cuda":
            raise ValueError(f"GpuSpin spins a CUDA kernel and needs a GPU, not {device}")
        self.device = device
        self.shape = (clips, 3, frames, height, width)
        self.cycles = int(ms * self._cycles_per_ms())

    def _cycles_per_ms(self, cycles: int = 10_000_000) -> float:
        until = time.perf_counter() + self.WARM_UP_S  # the first launch also loads the kernel
        while time.perf_counter() < until:
            torch.cuda._sleep(cycles // 10)
            torch.cuda.synchronize(self.device)
        rates = []
        for _ in range(self.CALIBRATIONS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / start.elapsed_time(end))
        return max(rates)

    @staticmethod
    def output_shape(clips: int = 2, frames: int = 4, height: int = 16, width: int = 16,
                     input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return input_shapes if input_shapes is not None else ((clips, 3, frames, height, width),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        torch.cuda._sleep(self.cycles)
        if tensors:
            return StepOutput((tensors[0].clone(),), non_tensors, time_card)
        frames = torch.cat([SyntheticFrames.frames_for(card.item_id, self.shape) for card in as_cards(time_card)])
        return StepOutput((frames.to(self.device, non_blocking=True),), {"request": non_tensors["request"]}, time_card)
