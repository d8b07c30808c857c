"""What bounded a job, and who missed its frames: the one sentence every stream answer and summary ends with.

A job's bottleneck is its busiest step when near saturation
(rnb.analysis.utilisation).  Below saturation no step's capacity bounded
it, and what that means depends on how the job went: a job that served
its load was bounded by the load; one that sent every request at once, by
the time between the models; one that stalled or failed did not serve its
load at all; and a camera-stream job whose frames were missed anyway was
missed by something other than a step's capacity: the host stalled its
runners (frames late while every step was mostly idle), or the frames'
latency is over their deadline even unloaded.  A stream search runs a
count whose frames a host stall missed again before it decides the answer
(rnb.analysis.stream_search).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rnb.analysis.utilisation import SATURATED
from rnb.core.termination import COMPLETE_REASONS
from rnb.load import logged_mode

# A runner that waited for a core this share of the time or more was slowed by the host as much as by its work.
STARVED = 0.1


@dataclass(frozen=True)
class JobBound:
    """The busiest step of a job and how busy it was, how the job ended, and its frames missed (camera streams)."""

    step: int | None        # the busiest step; None when no runner's work was measured
    model: str | None       # its model's class name, where the log names it
    busy: float | None      # the mean busy fraction of its runners
    reason: str             # the job's termination reason
    saturating: bool        # its load sent every request at once (bulk)
    offered: int = 0        # frames offered (0 for a job without streams)
    late: int = 0
    dropped: int = 0
    missed: int = 0         # late, and under the drop policy also dropped
    deadline_ms: float | None = None
    service_ms: float | None = None   # an item's own time in the steps (copies and calls, no waits): its unloaded latency
    waited: float | None = None       # the share of the time the busiest step's runners waited, runnable, for a core
    reach_ms: float | None = None     # the measured items' median wait to be taken by step 0 (on Ray, the hop to it)

    @staticmethod
    def of(row: Mapping[str, Any]) -> JobBound:
        """From a row of the jobs table (rnb.analysis.jobs.summarize_job)."""
        step = row.get("busiest_step")
        models = json.loads(row.get("step_models") or "[]")
        model = models[step] if step is not None and step < len(models) and isinstance(models[step], str) else None
        streams = json.loads(row["streams_record"]) if row.get("streams_record") else {}
        late, dropped = int(row.get("frames_late") or 0), int(row.get("frames_dropped") or 0)
        deadline = streams.get("deadline_ms")
        return JobBound(step, None if model is None else model.rpartition(".")[2], row.get("busiest_busy_fraction"),
                        str(row.get("termination_reason")), logged_mode(row).saturating,
                        int(row.get("frames_offered") or 0), late, dropped,
                        late + (dropped if streams.get("policy") == "drop" else 0),
                        float(deadline) if isinstance(deadline, (int, float)) else None, service_ms(row),
                        _waited(row, step), row.get("queue0_p50_ms"))

    @property
    def saturated(self) -> bool:
        return self.busy is not None and self.busy >= SATURATED

    @property
    def over_deadline(self) -> bool:
        """An item's own time in the steps, waits left out, is over the frames' deadline: they are late at any load,
        not only when they queue."""
        return self.deadline_ms is not None and self.service_ms is not None and self.service_ms > self.deadline_ms

    @property
    def host_stall(self) -> bool:
        """Frames missed while no step was saturated, within a job that ran as asked and whose frames are on time
        when served at once: the host, not the pipeline, missed them."""
        return (self.missed > 0 and self.step is not None and not self.saturated and not self.over_deadline
                and self.reason in COMPLETE_REASONS)

    @property
    def starved(self) -> bool:
        """The busiest step's runners waited for a core a tenth of the time or more: the host's cores (its other work,
        or the job's other processes) slowed them."""
        return self.waited is not None and self.waited >= STARVED

    @property
    def busiest(self) -> str:
        """`step 0 (AsyncSleep)`, or `step 0` where the log names no model."""
        return f"step {self.step}" + (f" ({self.model})" if self.model else "")

    def frames(self) -> str:
        """`87 of 400 frames (12 late, 75 dropped)`."""
        return f"{self.missed} of {self.offered} frames ({self.late} late, {self.dropped} dropped)"

    def words(self) -> str:
        """The bottleneck line's words: the saturated step, or why none bounded the job and who missed its frames."""
        if self.step is None or self.busy is None:
            return "no runner's work was measured, so nothing names a bottleneck"
        busy = f"{self.busy:.0%} of the elapsed time on average"
        if self.saturated:
            if not self.missed:
                return f"step {self.step} (its runners busy {busy})"
            if self.starved:
                return (f"step {self.step} (its runners busy {busy}, though waiting for a core {self.waited:.0%} of "
                        f"it): the host's cores (the pipeline's own CPU, or other work on the host), as much as the "
                        f"step, missed {self.frames()}")
            return f"step {self.step} (its runners busy {busy}); it, not the host, missed {self.frames()}"
        waits = f", waiting for a core {self.waited:.0%} of it" if self.starved else ""
        busiest = f"(the busiest, step {self.step}, {busy}{waits})"
        if self.reason not in COMPLETE_REASONS:
            return f"no step was saturated, and the job ended as {self.reason!r} without serving its load {busiest}"
        if self.over_deadline:
            return (f"no step was saturated, yet {self.frames()} were missed: an item's own time in the steps, "
                    f"{self.service_ms:.3g} ms without waits, is over their {self.deadline_ms:g} ms deadline {busiest}")
        if self.missed:
            reach = "" if self.reach_ms is None else f"; a frame waited a median {self.reach_ms:.3g} ms to reach step 0"
            return (f"no step was saturated, yet {self.frames()} were missed: a host stall, not the pipeline's "
                    f"capacity, missed them {busiest}{reach}")
        if self.saturating:
            # Every request was queued at the start: the load was all the pipeline could take, yet no model kept busy.
            return (f"no step was saturated, though every request was sent at once: the time between the models "
                    f"(queues, copies, hand-overs) bounds it {busiest}")
        return f"no step was saturated: the pipeline served the offered load {busiest}"

    def trial_words(self) -> str:
        """What a stream search's trial says of its bound: the busiest step, and who missed its frames."""
        if self.step is None or self.busy is None:
            return "no runner's work measured"
        head = f"{self.busiest} busy {self.busy:.0%}"
        if not self.missed:
            return head
        if self.saturated and self.starved:
            return f"{head}, waiting for a core {self.waited:.0%} of the time: the host's cores missed the frames"
        if self.saturated:
            return f"{head}: the pipeline missed the frames"
        if self.host_stall:
            return f"{head}: a host stall (frames missed while no step was saturated)"
        if self.over_deadline:
            return f"{head}: an item's own time in the steps is over the deadline"
        return f"{head}: the job ended as {self.reason!r}"


def service_ms(row: Mapping[str, Any]) -> float | None:
    """The mean time an item spends in copies and model calls over every step (a jobs-table row's stage means): its
    latency with no wait for a queue, a slot or a sibling; None where the row has no stage means."""
    means = [row.get(f"{part}{k}_mean_ms") for k in range(int(row.get("num_steps") or 0)) for part in ("copy", "inside")]
    numbers = [float(mean) for mean in means if isinstance(mean, (int, float))]
    return sum(numbers) if numbers and len(numbers) == len(means) else None


def _waited(row: Mapping[str, Any], step: int | None) -> float | None:
    """The mean share of the time the runners of `step` waited, runnable, for a core; None where unknown."""
    waits = json.loads(row.get("run_wait_fraction") or "{}")
    mine = [share for name, share in waits.items() if step is not None and name.startswith(f"step{step}-")]
    return sum(mine) / len(mine) if mine else None
