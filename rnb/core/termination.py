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

    @property
    def reason(self) -> str:
        """The termination_reason written to meta.json."""
        return _REASONS[self]


_REASONS = {
    Termination.RUNNING: "running",
    Termination.TARGET_REACHED: "target reached",
    Termination.REQUEST_QUEUE_FULL: "request queue full",
    Termination.INTER_STEP_QUEUE_FULL: "inter-step queue full",
    Termination.PROCESS_FAILED: "process failed",
    Termination.INTERRUPTED: "interrupted",
    Termination.SETUP_FAILED: "setup failed",
    Termination.TERMINATED: "terminated",
}
