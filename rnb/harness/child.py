"""What every child process (client or runner) does around its own work.

Centralised so that failure reporting behaves identically everywhere: the
main process learns the error as one line, the job stops at once, and the
child's peak memory and the torch thread counts it ran with reach the job
log even when it failed.  `run_and_report` is the engine-independent part;
`child_main` adds what a spawned local process needs.
"""
from __future__ import annotations

import os
import resource
import sys
from typing import Any, Callable

import torch

from rnb.harness.control import POLL_S, Plumbing, Termination, TerminationFlag
from rnb.harness.messages import Exited, Failed
from rnb.harness.transport import Participant
from rnb.pipeline.gpus import device_memory_record

# How long an exiting child waits for its queued messages to be written (normally well under a millisecond).
FLUSH_S = 1.0


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
    peak_device, held = None, {}
    if device is not None and device.type == "cuda":
        peak_device = torch.cuda.max_memory_allocated(device)
        held = device_memory_record(str(torch.cuda.get_device_properties(device).uuid), os.getpid(),
                                    torch.cuda.memory_reserved(device))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    transport.report(Exited(name, peak_rss_bytes=peak_rss, peak_device_bytes=peak_device,
                            intra_op_threads=torch.get_num_threads(),
                            interop_threads=torch.get_num_interop_threads(), **held))
    return code


def child_main(name: str, plumbing: Plumbing, transport: Participant, work: Callable[[], None],
               device: torch.device | None = None) -> None:
    """A spawned process's whole life: run and report, flush what main needs, exit 0 (ok) or 1 (failed).

    The child was spawned ignoring Ctrl-C and SIGTERM, and dies with the main
    process (rnb.harness.lifeline): stopping children is the main process's business.
    """
    code = run_and_report(name, transport, work, device)
    pipeline_queues = [plumbing.requests, *(q for step in plumbing.step_queues for q in step.values())]
    for queue in [plumbing.status, plumbing.results, *pipeline_queues]:
        if plumbing.flag.is_set and queue in pipeline_queues:
            queue.cancel_join_thread()  # nobody will read what is left for the pipeline
        queue.close()
        _join_feeder(queue, plumbing.flag)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the main process needs is flushed; skip interpreter teardown, which
    # takes about a second with torch loaded and would only delay the job's end.
    os._exit(code)


def _join_feeder(queue: Any, flag: TerminationFlag, timeout_s: float = FLUSH_S) -> None:
    """Wait for the queue's feeder thread to send what this process put on it, but not for ever.

    While the job runs, everything must go: a bulk client is done as soon as
    its requests are queued, and its feeder may still hold thousands that
    the pipe cannot take until step 0 reads them.  Once the job has ended,
    a process killed while writing to the same queue may have left the
    queue's write lock held, and a feeder waiting for it would wait for
    good; after `timeout_s` the messages are given up (the main process
    notes the cut).  The feeder is multiprocessing's own thread, which
    Queue.join_thread would join without a timeout.
    """
    feeder = getattr(queue, "_thread", None)  # None when this process never put on the queue
    if feeder is None:
        return
    while feeder.is_alive() and not flag.is_set:
        feeder.join(POLL_S)
    feeder.join(timeout_s)
