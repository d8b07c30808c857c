"""What every process of a job (client or runner, on any engine) does around its own work.

Centralised so that failure reporting behaves identically everywhere: the
job's counter learns the error as one line, the job stops at once, and the
process's peak memory and the torch thread counts it ran with reach the job
log even when it failed.  A process that never loaded torch (Ray's client
actor) reports no thread counts rather than importing it to ask: that
import is about 2 s of CPU.  Each engine wraps `run_and_report` in what its
processes need besides (rnb.engines.local.child, rnb.engines.ray.actors).
"""
from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rnb.core.messages import Exited, Failed
from rnb.core.termination import Termination
from rnb.engines.transport_protocols import Participant
from rnb.pipeline.gpus import DeviceMemory, device_memory_record

if TYPE_CHECKING:
    import torch


def run_and_report(name: str, transport: Participant, work: Callable[[], None],
                   device: torch.device | None = None) -> int:
    """Run `work`, report how it ended (Failed if it raised, then Exited) and return 0 (ok) or 1 (failed)."""
    code = 0
    try:
        work()
    except BaseException as error:  # the job must learn of any failure, whatever its type
        code = 1
        transport.report(Failed(name, f"{type(error).__name__}: {error}"))
        transport.stop(Termination.PROCESS_FAILED)
    peak_device: int | None = None
    held = DeviceMemory(None, None)
    threads: tuple[int | None, int | None] = (None, None)
    if "torch" in sys.modules:   # else it ran no torch thread, nor on a device
        import torch

        threads = torch.get_num_threads(), torch.get_num_interop_threads()
        if device is not None and device.type == "cuda":
            peak_device = torch.cuda.max_memory_allocated(device)
            held = device_memory_record(str(torch.cuda.get_device_properties(device).uuid), os.getpid(),
                                        torch.cuda.memory_reserved(device))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    transport.report(Exited(name, peak_rss_bytes=peak_rss, peak_device_bytes=peak_device,
                            intra_op_threads=threads[0], interop_threads=threads[1],
                            device_process_bytes=held.device_process_bytes,
                            device_outside_allocator_bytes=held.device_outside_allocator_bytes))
    return code
