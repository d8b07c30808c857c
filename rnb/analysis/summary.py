"""The human-readable end-of-run summary: throughput, per-stage latency, busy runners.

It reads the timings file that goes to the job log, one step's columns at a
time, so what it holds per item is a few numbers, not a row; it names the
stages as every other view does (rnb.core.stages); the busy fractions
and the bottleneck are `analyze.py`'s own lines over the log just written, so
what is printed and what is logged or analysed later cannot disagree.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rnb.analysis.job_columns import latency_stats, load_columns, stat_column, step_models
from rnb.analysis.job_dirs import Job, read_job
from rnb.analysis.jobs import MeasuredWindow, ValidityRules, measured_rows, measured_window, window_seconds
from rnb.analysis.loadgen_log import loadgen_log_columns
from rnb.analysis.report import format_utilisation, verdict_lines
from rnb.analysis.streams import format_streams, stream_columns
from rnb.analysis.utilisation import busy_columns, utilisation_columns
from rnb.core.joblog import TIMINGS_FILE, read_meta
from rnb.core.stages import (
    COPY,
    END_TO_END,
    ENQUEUE,
    INSIDE,
    PARTS,
    QUEUE,
    StepEvents,
    event_seconds,
    model_spans,
    part_key,
    part_latencies,
    step_columns,
    step_latencies,
)
from rnb.load import DUE_FIELD


def job_summary(job_dir: Path, window: MeasuredWindow | None = None) -> str:
    """The summary printed at the end of a run, from its log: stage latencies, busy runners, then the verdict
    (`window`, the job's judgement, if the caller has it already)."""
    meta = read_meta(job_dir)
    text = summary_text(job_dir / TIMINGS_FILE, meta.num_steps, meta.setting("warmup", 0), meta.finished_items,
                        meta.elapsed_s, meta.termination_reason)
    streams = format_streams(meta.streams) if meta.streams is not None else None
    verdict = verdict_text(job_dir, judged(job_dir) if window is None else window)
    return "\n".join(filter(None, (text, streams, utilisation_text(job_dir), verdict)))


def judged(job_dir: Path) -> MeasuredWindow:
    """The job's verdict over its measured window, by RnB's rules at analyze.py's defaults, or its scenario's."""
    job = read_job(job_dir, columns=lambda steps: (DUE_FIELD,))
    return measured_window(job, measured_rows(job), ValidityRules())


def verdict_text(job_dir: Path, window: MeasuredWindow) -> str:
    """The verdict's lines as analyze.py words them (rnb.analysis.report.verdict_lines), from the job's window."""
    scenario = window.scenario
    row = {"validity": "INVALID" if window.invalid_because else "VALID", "invalid_because": window.invalid_because,
           "scenario": None if scenario is None else scenario.scenario,
           "loadgen_rules": None if scenario is None else scenario.rules_text(),
           "loadgen_result": None if scenario is None else json.dumps(dict(scenario.result)),
           **loadgen_log_columns(job_dir)}
    return "\n".join(verdict_lines(row))


def summary_text(timings: Path, num_steps: int, warmup: int, finished: int, elapsed: float | None,
                 reason: str) -> str:
    lines = [f"termination: {reason}"]
    file = pq.ParquetFile(timings)
    measured = pc.invert(file.read(columns=["is_warmup"]).column("is_warmup"))
    count = pc.sum(measured.cast(pa.int64())).as_py() or 0
    if elapsed:
        lines.append(throughput_line(file, measured, count, num_steps, finished, elapsed))
    if count == 0:
        lines.append(f"latency: no items after the first {warmup} (warmup) to report")
        return "\n".join(lines)
    lines.append(f"latency in ms over {count} items (the first {warmup} items are warmup, excluded):")
    lines.append(f"  {'stage':<22}{'mean':>10}{'p50':>10}{'p99':>10}")
    for stage, seconds in _stage_latencies(file, measured, num_steps):
        ms = seconds[~np.isnan(seconds)] * 1000
        if ms.size:
            lines.append(f"  {stage:<22}{ms.mean():>10.2f}{np.percentile(ms, 50):>10.2f}{np.percentile(ms, 99):>10.2f}")
    return "\n".join(lines)


def throughput_line(file: pq.ParquetFile, measured: pa.ChunkedArray, count: int, num_steps: int, finished: int,
                    elapsed: float) -> str:
    """The measured window's throughput (analyze.py's and the tuner's figure) first, then that of every item.

    The two differ: the first leaves out the warm-up items and the time
    before the first measured item was sent.
    """
    every = f"all {finished} items: {finished / elapsed:.2f} items/s in {elapsed:.3f} s"
    if count == 0:
        return f"throughput: no measured window (all {finished} items are warm-up); {every}"
    ends = [ENQUEUE, StepEvents(num_steps - 1).handed_over]
    window = window_seconds(pa.table({name: file.read(columns=[name]).column(0).filter(measured) for name in ends}),
                            num_steps)
    warm = finished - count
    if window <= 0:
        return f"throughput: no measured window (the {count} measured items after {warm} warm-up span no time); {every}"
    return f"throughput: {count / window:.2f} items/s ({count} measured items after {warm} warm-up, in {window:.3f} s); {every}"


def _stage_latencies(file: pq.ParquetFile, measured: pa.ChunkedArray, num_steps: int) -> Iterator[tuple[str, np.ndarray]]:
    """Each step's parts, then the end-to-end latency, over the measured items, reading one step's columns at a time."""
    present = set(file.schema_arrow.names)

    def read(names: list[str]) -> pa.Table:
        # A column at a time, on this thread: the reader's buffers for one column at once, not for several.
        return pa.table({name: file.read(columns=[name], use_threads=False).column(0).filter(measured)
                         for name in dict.fromkeys(names) if name in present})

    before = ENQUEUE
    spans = model_spans(present)
    for k in range(num_steps):
        table = read([before, *step_columns(k)])
        latencies = step_latencies(table, k, event_seconds(table, before))
        for part in PARTS:
            yield f"step {k} {part.name}", latencies[part_key(part, k)]
        for name in spans:
            yield f"step {k}  {name.replace('_', ' ')}", _span_inside(read([f"{name}_start", f"{name}_finish"]), name,
                                                                     table, k)
        del table
        before = StepEvents(k).handed_over
    ends = read([ENQUEUE, before])
    yield END_TO_END.name, event_seconds(ends, before) - event_seconds(ends, ENQUEUE)


def _span_inside(span: pa.Table, name: str, step: pa.Table, k: int) -> np.ndarray:
    """A model's span in seconds for the items whose span lies inside step k's call (NaN for the others): the
    stage table shows it under the step's inside, as the trace nests it there."""
    began, ended = event_seconds(span, f"{name}_start"), event_seconds(span, f"{name}_finish")
    events = StepEvents(k)
    within = (began >= event_seconds(step, events.started)) & (ended <= event_seconds(step, events.finished))
    return np.where(within, ended - began, np.nan)


def utilisation_text(job_dir: Path) -> str:
    """Each runner's busy fraction and CPU use and the bottleneck step of a logged job; '' when none ran."""
    job = read_job(job_dir, columns=busy_columns)
    # What the bottleneck line reads besides the busy fractions: the load, how the job ended, its frames missed.
    told = {**load_columns(job.meta.args), **stream_columns(job.meta.streams), "step_models": step_models(job),
            "termination_reason": job.meta.termination_reason, "num_steps": job.num_steps, **_own_time(job)}
    return format_utilisation({**utilisation_columns(job), **told})


def _own_time(job: Job) -> dict[str, float | None]:
    """Each step's mean copy and call times, and step 0's median queue wait, over the measured items (the jobs
    table's columns of them)."""
    latencies = part_latencies(measured_rows(job), job.num_steps)
    own = {stat_column(part_key(part, k), "mean"): latency_stats(latencies[part_key(part, k)])["mean"]
           for k in range(job.num_steps) for part in (COPY, INSIDE)}
    return {**own, stat_column(part_key(QUEUE, 0), "p50"): latency_stats(latencies[part_key(QUEUE, 0)])["p50"]}
