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

Both wait the same way, by `wait_until_done`: asking the mark whether it is
done, between sleeps of 1 % of the time waited so far, at least
POLL_SLEEP_MIN_S and at most POLL_SLEEP_MAX_S (so a finish is stamped at
most 1 %, or 10 ms, plus a sleep's own overshoot late).  A synchronise spins
for as long as the device works, so a device that never finishes would look,
from the process's CPU use, like a step computing, and every waiting runner
would take a core from the host's decoders and hops; a runner waiting this
way is asleep almost all the time, which is how the stall watch
(rnb.engines.stall) tells a hung device from a busy one.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch


class DeviceMark(Protocol):
    """A point in a device's queue of work: everything queued before it."""

    def query(self) -> bool:
        """Whether all work queued before this mark has completed; returns at once."""

    def wait(self) -> None:
        """Block until all work queued before this mark has completed (`wait_until_done` its query)."""

    def ms_since(self, earlier: DeviceMark) -> float:
        """Device milliseconds between an earlier mark of the same queue and this one; both must have completed."""


class DeviceQueue(Protocol):
    """Where a step's device work is queued in order (a CUDA stream)."""

    def mark(self) -> DeviceMark:
        """A mark after everything queued so far."""


POLL_SLEEP_MIN_S = 50e-6  # the shortest sleep between asks: a few microseconds of CPU per ask, not a spin
POLL_SLEEP_MAX_S = 0.01   # the longest sleep between asks


def wait_until_done(done: Callable[[], bool]) -> None:
    """Return once `done()` (a mark's query) is true, asking it as the module docstring says."""
    began = time.monotonic()
    while not done():
        waited = time.monotonic() - began
        time.sleep(min(POLL_SLEEP_MAX_S, max(POLL_SLEEP_MIN_S, waited / 100)))


class CudaMark:
    """A CUDA event recorded on a stream, with timing."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(stream)

    def query(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        wait_until_done(self.query)

    def ms_since(self, earlier: DeviceMark) -> float:
        if not isinstance(earlier, CudaMark):
            raise TypeError(f"a CUDA mark can only be timed against another, not a {type(earlier).__name__}")
        return float(earlier.event.elapsed_time(self.event))


class CudaQueue:
    """A runner's CUDA stream as a DeviceQueue: its marks are CUDA events (two records and a wait per item)."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream

    def mark(self) -> CudaMark:
        return CudaMark(self.stream)
