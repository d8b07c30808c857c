"""How busy each runner was, and what the sampled CPU, memory and GPU series say.

A runner's busy fraction is the time inside its model (the union of the
inside intervals of the items it ran, so a batch counts once) over the job's
elapsed time. The step whose replicas are busiest on average is the
bottleneck: it is the one that would have to get faster, or get more
replicas, for the pipeline to go faster.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rnb.analysis.routing import replicas
from rnb.core.stages import StepEvents

if TYPE_CHECKING:  # jobs.py builds its table from this module's columns
    from rnb.analysis.jobs import Job, JobRow


@dataclass(frozen=True)
class Bottleneck:
    step: int
    busy: float                # mean busy fraction of the step's runners
    runners: tuple[str, ...]


def union_seconds(starts: np.ndarray, ends: np.ndarray) -> float:
    """The length of the union of the intervals [start, end)."""
    order = np.argsort(starts, kind="stable")
    total, reach = 0.0, -np.inf
    for start, end in zip(starts[order], ends[order]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return float(total)


def busy_columns(num_steps: int) -> list[str]:
    """The timings columns `utilisation_columns` reads besides those every job has: who ran each item."""
    return [f"{name}{k}" for k in range(num_steps) for name in ("group", "instance", "device")]


def busy_fractions(job: Job) -> dict[str, float]:
    """Each runner's time inside its model over the elapsed time, clipped to [start, end]; {} without both."""
    start, end = job.meta.start_time, job.meta.end_time
    if start is None or end is None or end <= start:
        return {}
    busy: dict[str, float] = {}
    for k in range(job.num_steps):
        events = StepEvents(k)
        began = np.clip(job.timings.column(events.started).to_numpy(zero_copy_only=False).astype(float), start, end)
        ended = np.clip(job.timings.column(events.finished).to_numpy(zero_copy_only=False).astype(float), start, end)
        names = np.array(replicas(job, k), dtype=object)
        for process in job.meta.processes:
            if process.role == "runner" and process.step == k:
                mine = (names == process.name) & ~np.isnan(began) & ~np.isnan(ended)
                busy[process.name] = union_seconds(began[mine], ended[mine]) / (end - start)
    return busy


def bottleneck(job: Job, busy: dict[str, float]) -> Bottleneck | None:
    """The step whose runners were busiest on average (the earlier step on a tie); None when nothing was measured."""
    best = None
    for k in range(job.num_steps):
        names = tuple(p.name for p in job.meta.processes if p.role == "runner" and p.step == k and p.name in busy)
        if names:
            mean = sum(busy[name] for name in names) / len(names)
            if best is None or mean > best.busy:
                best = Bottleneck(k, mean, names)
    return best


def cpu_percent(samples: pa.Table, start: float, end: float) -> dict[str, float]:
    """Each process's CPU use over its samples within [start, end], in percent of one core (200 = two cores)."""
    within = pc.and_(pc.greater_equal(samples.column("time"), start), pc.less_equal(samples.column("time"), end))
    processes = samples.filter(pc.and_(within, pc.is_valid(samples.column("process"))))
    result = {}
    for name in processes.column("process").unique().to_pylist():
        mine = processes.filter(pc.equal(processes.column("process"), name))
        times = mine.column("time").to_numpy()
        cpu = mine.column("cpu_s").to_numpy()
        if times.size >= 2 and times[-1] > times[0]:
            result[name] = float(100.0 * (cpu[-1] - cpu[0]) / (times[-1] - times[0]))
    return result


def utilisation_columns(job: Job) -> JobRow:
    """The jobs-table columns of this module: busy fractions, the bottleneck, sampled CPU use."""
    busy = busy_fractions(job)
    neck = bottleneck(job, busy)
    start, end = job.meta.start_time, job.meta.end_time
    return {
        "busy_fraction": json.dumps(busy),
        "bottleneck_step": None if neck is None else neck.step,
        "bottleneck_busy_fraction": None if neck is None else neck.busy,
        "cpu_percent": json.dumps(cpu_percent(job.samples, start, end)
                                  if job.samples is not None and start is not None and end is not None else {}),
    }
