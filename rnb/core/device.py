"""The seam between a runner and asynchronous device work: marks it can wait on and time.

On a GPU a model's call returns once its kernels are queued, long before
they have run; a step's `inference{k}_finish` stamped at the return would
charge the device's time to whatever waits next (a slot write, the next
item's copy) or, at the final step, to nothing at all.  So the runner asks
the device for a mark after the call, waits for it, and only then stamps
the finish; two marks around the call also give the device's own measure
of the work (`device_ms{k}`).

`CudaQueue` is the seam over a CUDA stream (events recorded on it);
`models.toy.AsyncSleep` brings its own, a CPU stand-in whose work completes
on a worker thread, so that the same code path runs in tests without a GPU.
"""
from __future__ import annotations

from typing import Protocol

import torch


class DeviceMark(Protocol):
    """A point in a device's queue of work: everything queued before it."""

    def wait(self) -> None:
        """Block until all work queued before this mark has completed."""

    def ms_since(self, earlier: DeviceMark) -> float:
        """Device milliseconds between an earlier mark of the same queue and this one; both must have completed."""


class DeviceQueue(Protocol):
    """Where a step's device work is queued in order (a CUDA stream)."""

    def mark(self) -> DeviceMark:
        """A mark after everything queued so far."""


class CudaMark:
    """A CUDA event recorded on a stream, with timing."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(stream)

    def wait(self) -> None:
        self.event.synchronize()

    def ms_since(self, earlier: DeviceMark) -> float:
        if not isinstance(earlier, CudaMark):
            raise TypeError(f"a CUDA mark can only be timed against another, not a {type(earlier).__name__}")
        return float(earlier.event.elapsed_time(self.event))


class CudaQueue:
    """A runner's CUDA stream as a DeviceQueue: its marks are CUDA events (two records and a synchronise per item)."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream

    def mark(self) -> CudaMark:
        return CudaMark(self.stream)
