"""Small stand-in models, selectors and sources for the config tests, and models that misbehave one exact way.

They keep the broken-config corpus independent of the real models, whose
keywords may change; each class has just the surface that validation checks.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from models.toy import SyntheticFrames
from rnb.core.model import NonTensors, StepOutput, Tensors
from rnb.core.timecard import TimeCard

NOT_A_CLASS = 3


class Frames:
    """Step 0: one (1, 4) tensor per request, filled with the request number."""

    def __init__(self, device: torch.device, **kwargs: Any) -> None:
        self.device = device
        self.kwargs = kwargs

    @staticmethod
    def output_shape(**kwargs: Any) -> tuple[tuple[int, ...], ...]:
        return ((1, 4),)

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        request = int(non_tensors["request"])
        return (torch.full((1, 4), float(request), device=self.device),), {}, time_card


class StreamEcho(Frames):
    """Step 0 (and the last): Frames, writing the stream and frame index its non_tensors carried onto its card, so a
    test reads what the model was given beside what the client stamped."""

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        time_card.set_field("given_stream", non_tensors.get("stream", -1))
        time_card.set_field("given_frame", non_tensors.get("frame", -1))
        return super().__call__(tensors, non_tensors, time_card)


class Head:
    """Final step: sums its input, writes no tensor; it stands in for a merging step too."""

    merges_segments = True

    def __init__(self, device: torch.device, **kwargs: Any) -> None:
        self.device = device
        self.kwargs = kwargs

    @staticmethod
    def output_shape(**kwargs: Any) -> None:
        return None

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        return (), {"sum": float(tensors[0].sum())}, time_card


class NeedsWidth(Head):
    """A final step whose constructor requires `width`, so a config without it must be rejected."""

    def __init__(self, device: torch.device, width: int, height: int = 1) -> None:
        super().__init__(device, width=width, height=height)


class NoOutputShape:
    """A model missing output_shape, which validation must reject."""

    def __init__(self, device: torch.device, **kwargs: Any) -> None:
        self.device = device


class FirstQueue:
    """A selector that always picks queue 0."""

    def __init__(self, num_queues: int, **kwargs: Any) -> None:
        self.num_queues = num_queues

    def select(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> int:
        return 0


class NoSelect:
    """A selector missing select, which validation must reject."""

    def __init__(self, num_queues: int, **kwargs: Any) -> None:
        self.num_queues = num_queues


class TwoPaths:
    """A video_path_iterator in RnB's old form: an iterable of file paths."""

    def __iter__(self) -> Iterator[str]:
        return iter(["a.mp4", "b.mp4"])


class Digest:
    """Final step: records a digest of its input tensors' bytes, so two runs can be compared item by item, and the
    CUDA_DEVICE_ORDER its process runs with (the Ray engine's actors must number GPUs as NVML does).

    It runs on any device and reads its inputs on the CPU, so it keeps nothing of the device.
    """

    def __init__(self, device: torch.device) -> None:
        pass

    output_shape = staticmethod(Head.output_shape)

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        digest = hashlib.sha256()
        for tensor in tensors:
            digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
        time_card.set_field("digest", digest.hexdigest()[:16])
        time_card.set_field("cuda_device_order", os.environ.get("CUDA_DEVICE_ORDER", "unset"))
        return (), non_tensors, time_card


class TwoPartError(Exception):
    """An error that pickles (as its class and its one message) but cannot be rebuilt: __init__ wants two arguments."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class HandsOnItsError(SyntheticFrames):
    """Step 0 that, on item `error_at_item`, passes the error it raised on to the next step in its non_tensors.

    The next step's runner cannot unpickle that message, as a model's
    exception class with a two-argument constructor would leave it.
    """

    def __init__(self, device: torch.device, error_at_item: int = 3, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self.error_at_item = error_at_item

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: TimeCard) -> StepOutput:
        output = super().__call__(tensors, non_tensors, time_card)
        if time_card.item_id != self.error_at_item:
            return output
        try:
            raise TwoPartError("decoding", f"item {time_card.item_id} is cut short")
        except TwoPartError as error:
            return StepOutput(output.tensors, {**output.non_tensors, "error": error}, output.time_card)


class Surroundings(Head):
    """Final step: writes onto each card what its process was started with, for the tests of how children start.

    `mark`: the number in RNB_TEST_MARK (-1 without it); `forked`: 1 if the
    process's parent is multiprocessing's fork server, 0 if not;
    `timer_slack_ns`: its thread's timer slack (prctl PR_GET_TIMERSLACK).
    It also says on stderr that it is ready, with its pid.
    """

    def __init__(self, device: torch.device, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent:
            self.forked = int(b"multiprocessing.forkserver" in parent.read())
        self.mark = int(os.environ.get("RNB_TEST_MARK", "-1"))
        self.timer_slack_ns = ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)   # PR_GET_TIMERSLACK
        print(f"Surroundings ready in pid {os.getpid()}", file=sys.stderr, flush=True)

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        time_card.set_field("mark", self.mark)
        time_card.set_field("forked", self.forked)
        time_card.set_field("timer_slack_ns", self.timer_slack_ns)
        return super().__call__(tensors, non_tensors, time_card)
