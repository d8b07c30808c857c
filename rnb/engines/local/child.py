"""What a spawned local child does after its work: flush what main needs, then leave at once.

The child was spawned ignoring Ctrl-C and SIGTERM, and dies with the main
process (rnb.engines.local.lifeline): stopping children is the main process's business.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from rnb.core.termination import POLL_S
from rnb.engines.local.plumbing import Plumbing, TerminationFlag
from rnb.engines.participant import run_and_report
from rnb.engines.transport_protocols import Participant

# How long an exiting child waits for its queued messages to be written (normally well under a millisecond).
FLUSH_S = 1.0


def child_main(name: str, plumbing: Plumbing, transport: Participant, work: Callable[[], None],
               device: torch.device | None = None, release: Callable[[], None] | None = None) -> None:
    """A spawned process's whole life: run and report, release, flush what main needs, exit 0 (ok) or 1 (failed).

    `release` gives back what the process holds of others' memory (a
    runner's shared slots) before it leaves, which os._exit would not.  The
    child was spawned ignoring Ctrl-C and SIGTERM, and dies with the main
    process (rnb.engines.local.lifeline): stopping children is the main process's business.
    """
    code = run_and_report(name, transport, work, device)
    if release is not None:
        try:
            release()
        except Exception as error:  # a CUDA error left by a failed run: the exit must still happen
            print(f"{name}: could not release its shared slots ({type(error).__name__}: {error})", file=sys.stderr)
    # The rings (requests, signals, results) hold whatever was put on them already; only the status queue has a
    # feeder thread that may still be writing.
    plumbing.status.close()
    _join_feeder(plumbing.status, plumbing.flag)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the main process needs is flushed; skip interpreter teardown, which
    # takes about a second with torch loaded and would only delay the job's end.
    os._exit(code)


def _join_feeder(queue: Any, flag: TerminationFlag, timeout_s: float = FLUSH_S) -> None:
    """Wait for the queue's feeder thread to send what this process put on it, but not for ever.

    While the job runs, everything must go.  Once the job has ended, a
    process killed while writing to the same queue may have left the
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
