"""How a job ends, whatever the engine: the termination flag's values and how often waits look at it."""
from __future__ import annotations

from enum import IntEnum

# How long any blocking wait lasts before it re-checks the termination flag.
POLL_S = 0.05


class Termination(IntEnum):
    """Values of the termination flag; RUNNING until the first reason wins."""

    RUNNING = 0
    TARGET_REACHED = 1
    REQUEST_QUEUE_FULL = 2
    INTER_STEP_QUEUE_FULL = 3
    PROCESS_FAILED = 4
    INTERRUPTED = 5
    SETUP_FAILED = 6  # the main process could not build the queues or shared tensors
    TERMINATED = 7    # SIGTERM: what kill, schedulers and containers send
    STALLED = 8       # items waited and none left any step for --stall-s seconds (or start-up stood still that long)
    MAX_DURATION = 9  # --max-duration seconds of measured time passed (LoadGen's max_duration): a complete run
    LOG_FAILED = 10   # the main process could not write the job's log (a full or failing --log-dir)

    @property
    def reason(self) -> str:
        """The termination_reason written to meta.json."""
        return _REASONS[self]

    @property
    def completes_run(self) -> bool:
        """Whether the job ran as asked to its end: what it measured is a run, to be judged by the validity rules."""
        return self in (Termination.TARGET_REACHED, Termination.MAX_DURATION)


_REASONS = {
    Termination.RUNNING: "running",
    Termination.TARGET_REACHED: "target reached",
    Termination.REQUEST_QUEUE_FULL: "request queue full",
    Termination.INTER_STEP_QUEUE_FULL: "inter-step queue full",
    Termination.PROCESS_FAILED: "process failed",
    Termination.INTERRUPTED: "interrupted",
    Termination.SETUP_FAILED: "setup failed",
    Termination.TERMINATED: "terminated",
    Termination.STALLED: "stalled",
    Termination.MAX_DURATION: "max duration",
    Termination.LOG_FAILED: "log write failed",
}
# The termination_reason of a job that ran as asked to its end (Termination.completes_run), as meta.json spells it.
COMPLETE_REASONS = tuple(t.reason for t in Termination if t.completes_run)
