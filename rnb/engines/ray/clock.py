"""How far each node's clock runs ahead of the driver's: every time card is stamped on the driver's clock."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_ROUND_TRIPS = 5     # per node; the shortest round trip gives the offset


@dataclass(frozen=True)
class ClockOffset:
    """How far a node's clock runs ahead of the driver's, from the shortest of a few round trips."""

    offset_s: float
    round_trip_s: float


def measure_offset(remote_clock: Callable[[], float], round_trips: int = CLOCK_ROUND_TRIPS,
                   local_clock: Callable[[], float] = time.time) -> ClockOffset:
    """Ask `remote_clock()` (blocking, returns the remote time) a few times; keep the tightest bracket."""
    best: ClockOffset | None = None
    for _ in range(round_trips):
        sent = local_clock()
        remote = remote_clock()
        back = local_clock()
        if best is None or back - sent < best.round_trip_s:
            best = ClockOffset(remote - (sent + back) / 2, back - sent)
    assert best is not None
    return best
