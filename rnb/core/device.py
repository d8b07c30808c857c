"""The seam between a runner and asynchronous device work: marks it can wait on and time.

On a GPU a model's call returns once its kernels are queued, long before
they have run; a step's `inference{k}_finish` stamped at the return would
charge the device's time to whatever waits next (a slot write, the next
item's copy) or, at the final step, to nothing at all.  So the runner asks
the device for a mark after the call, waits for it, and only then stamps
the finish; two marks around the call also give the device's own measure
of the work (`device_ms{k}`).

`CudaQueue` is the seam over a CUDA stream (events recorded on it);
`models.toy.AsyncSleep` brings its own, a CPU stand-in whose work is booked
on a clock of its own, so that the same code path runs in tests without a GPU.

Neither polls.  A CUDA mark is an event made for blocking synchronisation
(cudaEventBlockingSync): its wait puts the runner's thread to sleep in the
driver until the event completes, so the finish is stamped as the work ends
and the thread uses no CPU meanwhile.  A plain synchronise spins a core for
as long as the device works: a device that never finished would look, from
the process's CPU use, like a step computing, and every waiting runner would
take a core from the host's decoders and hops; a runner waiting this way is
asleep, which is how the stall watch (rnb.engines.stall) tells a hung device
from a busy one.  An earlier version asked the event whether it was done
between sleeps of 1 % of the time waited so far, which stamped a finish up
to 1 % late and spent CPU on every ask.
"""
from __future__ import annotations

from typing import Protocol

import torch


class DeviceMark(Protocol):
    """A point in a device's queue of work: everything queued before it."""

    def query(self) -> bool:
        """Whether all work queued before this mark has completed; returns at once."""

    def wait(self) -> None:
        """Block, using no CPU, until all work queued before this mark has completed."""

    def ms_since(self, earlier: DeviceMark) -> float:
        """Device milliseconds between an earlier mark of the same queue and this one; both must have completed."""


class DeviceQueue(Protocol):
    """Where a step's device work is queued in order (a CUDA stream)."""

    def mark(self) -> DeviceMark:
        """A mark after everything queued so far."""


class CudaMark:
    """A CUDA event recorded on a stream, with timing; waiting on it sleeps in the driver until it completes."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.event = torch.cuda.Event(enable_timing=True, blocking=True)
        self.event.record(stream)

    def query(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()

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
