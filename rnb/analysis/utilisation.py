"""How busy each runner was, and what the sampled CPU, memory and GPU series say.

A runner's busy fraction is the time of its own work over the job's elapsed
time: the union of the model calls that produced its outputs, so a batch
counts once.  A step that holds inputs counts only that work: a batcher's
output is its work from the call that took the batch's last item (or from
the flush that handed a partial batch over, `flush{k}`), an aggregator's
from the call that took an item's last segment; the time items wait there
for company is latency, not work.  The step whose runners are busiest on
average is the bottleneck when it is near saturation (SATURATED): it is the
one that would have to get faster, or get more replicas, for the pipeline to
go faster.  Below that no step bounds the throughput: the offered load does.
The end-of-run summary, analyze.py and the tuner's "what bounds it" all read
this one definition.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rnb.analysis.routing import replicas
from rnb.core.stages import StepEvents

if TYPE_CHECKING:  # jobs.py builds its table from this module's columns
    from rnb.analysis.job_columns import JobRow
    from rnb.analysis.job_dirs import Job


# A step whose runners are busy at least this share of the elapsed time on average is near saturation: its
# queue grows without bound at a little more load (an M/M/1 queue holds 4 items on average at 80%).
SATURATED = 0.8


@dataclass(frozen=True)
class Bottleneck:
    """The step whose runners were busiest on average, and whether that is near saturation."""

    step: int
    busy: float                # mean busy fraction of the step's runners
    runners: tuple[str, ...]

    @property
    def saturated(self) -> bool:
        return self.busy >= SATURATED


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
    """The timings columns `utilisation_columns` reads besides those every job has: who ran each item, flushes."""
    return [f"{name}{k}" for k in range(num_steps) for name in ("group", "instance", "device", "flush")]


def busy_fractions(job: Job) -> dict[str, float]:
    """Each runner's own work over the elapsed time, clipped to [start, end]; {} without both."""
    start, end = job.meta.start_time, job.meta.end_time
    if start is None or end is None or end <= start:
        return {}
    busy: dict[str, float] = {}
    for k in range(job.num_steps):
        events = StepEvents(k)
        began, ended = (_seconds(job, name) for name in (events.started, events.finished))
        flushed = _seconds(job, events.flushed)
        names = np.array(replicas(job, k), dtype=object)
        for process in job.meta.processes:
            if process.role == "runner" and process.step == k:
                mine = (names == process.name) & ~np.isnan(began) & ~np.isnan(ended)
                calls, finishes = own_work(began[mine], ended[mine], flushed[mine])
                busy[process.name] = union_seconds(np.clip(calls, start, end), np.clip(finishes, start, end)) / (end - start)
    return busy


def own_work(started: np.ndarray, finished: np.ndarray, flushed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One runner's outputs as (start, finish) of the call that produced each, from its items' rows.

    The items of one output share its finish.  The call began when the last
    of them was taken (a batch's last item; a merged item's last segment,
    whose start its row holds), or when the flush that handed them over
    began.
    """
    finishes, output = np.unique(finished, return_inverse=True)
    calls = np.full(finishes.size, -np.inf)
    np.maximum.at(calls, output, started)
    flushes = np.full(finishes.size, np.nan)
    np.fmax.at(flushes, output, flushed)
    return np.where(np.isnan(flushes), calls, flushes), finishes


def _seconds(job: Job, column: str) -> np.ndarray:
    """A timings column as float seconds; NaN throughout when the log has no such column (no flush, an older log)."""
    if column not in job.timings.column_names:
        return np.full(job.timings.num_rows, np.nan)
    return job.timings.column(column).to_numpy(zero_copy_only=False).astype(float)


def busiest_step(job: Job, busy: dict[str, float]) -> Bottleneck | None:
    """The step whose runners were busiest on average (the earlier step on a tie); None when nothing was measured."""
    best = None
    for k in range(job.num_steps):
        names = tuple(p.name for p in job.meta.processes if p.role == "runner" and p.step == k and p.name in busy)
        if names:
            mean = sum(busy[name] for name in names) / len(names)
            if best is None or mean > best.busy:
                best = Bottleneck(k, mean, names)
    return best


# /proc counts a process's CPU time in clock ticks, so a share read over a shorter span than this could be off by more
# than a tenth of a core (two samples 10 ms apart whose counts differ by three ticks read 300%).
CPU_SHARE_MIN_SPAN_S = 10 / os.sysconf("SC_CLK_TCK")


def cpu_percent(samples: pa.Table, start: float, end: float) -> dict[str, float]:
    """Each process's CPU use over its samples within [start, end], in percent of one core (200 = two cores); a
    process whose samples there span less than CPU_SHARE_MIN_SPAN_S has none."""
    within = pc.and_(pc.greater_equal(samples.column("time"), start), pc.less_equal(samples.column("time"), end))
    processes = samples.filter(pc.and_(within, pc.is_valid(samples.column("process"))))
    result = {}
    for name in processes.column("process").unique().to_pylist():
        mine = processes.filter(pc.equal(processes.column("process"), name))
        times = mine.column("time").to_numpy()
        cpu = mine.column("cpu_s").to_numpy()
        if times.size >= 2 and times[-1] - times[0] >= CPU_SHARE_MIN_SPAN_S:
            result[name] = float(100.0 * (cpu[-1] - cpu[0]) / (times[-1] - times[0]))
    return result


def run_wait_fraction(samples: pa.Table, start: float, end: float) -> dict[str, float]:
    """Each process's time waiting, runnable, for a core over its samples within [start, end], as a share of that
    time (/proc's schedstat: what the host's other work, and the job's other processes, cost it); {} where the
    samples have no such column or the kernel reported none."""
    if "run_wait_s" not in samples.column_names:   # a log from before it was sampled
        return {}
    within = pc.and_(pc.greater_equal(samples.column("time"), start), pc.less_equal(samples.column("time"), end))
    processes = samples.filter(pc.and_(within, pc.is_valid(samples.column("run_wait_s"))))
    result = {}
    for name in processes.column("process").unique().to_pylist():
        mine = processes.filter(pc.equal(processes.column("process"), name))
        times, waits = mine.column("time").to_numpy(), mine.column("run_wait_s").to_numpy()
        if times.size >= 2 and times[-1] > times[0]:
            result[name] = float((waits[-1] - waits[0]) / (times[-1] - times[0]))
    return result


def energy_joules(samples: pa.Table, start: float, end: float) -> float | None:
    """The GPUs' energy over [start, end]: each GPU's sampled board power integrated over its samples' times
    (trapezoids), added up; None when no GPU reported power (a CPU job, or NVML without a power sensor)."""
    if "power_watts" not in samples.column_names:   # a log from before power was sampled
        return None
    within = pc.and_(pc.greater_equal(samples.column("time"), start), pc.less_equal(samples.column("time"), end))
    powered = samples.filter(pc.and_(within, pc.is_valid(samples.column("power_watts"))))
    if powered.num_rows == 0:
        return None
    total = 0.0
    for gpu in powered.column("gpu").unique().to_pylist():
        mine = powered.filter(pc.equal(powered.column("gpu"), gpu))
        times, watts = mine.column("time").to_numpy(), mine.column("power_watts").to_numpy()
        total += float(np.sum((watts[1:] + watts[:-1]) / 2.0 * np.diff(times)))
    return total


def energy_per_item(job: Job) -> float | None:
    """Joules per finished item over the job, start to end; None where no GPU reported power or nothing finished."""
    start, end, items = job.meta.start_time, job.meta.end_time, job.meta.finished_items
    if job.samples is None or start is None or end is None or not items:
        return None
    energy = energy_joules(job.samples, start, end)
    return None if energy is None else energy / items


def utilisation_columns(job: Job) -> JobRow:
    """The jobs-table columns of this module: busy fractions, the busiest step and the bottleneck, sampled CPU use.

    `bottleneck_step` is the busiest step when it is near saturation, else
    null: then the offered load, not a step, bounded the throughput.
    """
    busy = busy_fractions(job)
    busiest = busiest_step(job, busy)
    start, end = job.meta.start_time, job.meta.end_time
    return {
        "busy_fraction": json.dumps(busy),
        "busiest_step": None if busiest is None else busiest.step,
        "busiest_busy_fraction": None if busiest is None else busiest.busy,
        "bottleneck_step": busiest.step if busiest is not None and busiest.saturated else None,
        "cpu_percent": json.dumps(cpu_percent(job.samples, start, end)
                                  if job.samples is not None and start is not None and end is not None else {}),
        "run_wait_fraction": json.dumps(run_wait_fraction(job.samples, start, end)
                                        if job.samples is not None and start is not None and end is not None else {}),
        "energy_per_item_j": energy_per_item(job),
    }
