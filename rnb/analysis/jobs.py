"""Load job logs (`<log-dir>/<job_id>/`) into tables a script or a person can use.

A job directory holds `config.json`, `meta.json` and `timings.parquet` (one row
per finished item). This module turns a set of them into two pyarrow tables:
one row per job (arguments, throughput, LoadGen-style validity, latency
percentiles end to end and per stage, data rates, memory peaks) and one row
per item (the raw timings plus the derived latencies in milliseconds), so that
every question about a run is a filter or a group-by away.

Reading the directories is rnb.analysis.job_dirs; the columns of a row
beyond its settings and verdict are rnb.analysis.job_columns.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rnb.analysis.job_columns import (
    JobRow,
    batch_sizes,
    column_values,
    data_columns,
    latency_columns,
    load_columns,
    percentile_columns,
    process_columns,
    step_models,
    throughput_columns,
)
from rnb.analysis.job_dirs import Job, find_job_dirs, is_complete, read_job
from rnb.analysis.loadgen_log import loadgen_log_columns
from rnb.analysis.loadgen_rules import Verdict
from rnb.analysis.loads import spans_of
from rnb.analysis.stats import CONFIDENCE, min_items_for_upper_bound
from rnb.analysis.streams import few_frames, stream_columns
from rnb.analysis.utilisation import utilisation_columns
from rnb.analysis.verdict import overloaded, scenario_verdict
from rnb.core.joblog import (
    config_name,
)
from rnb.core.records import JobLogError
from rnb.core.stages import END_TO_END, ENQUEUE, StepEvents, part_latencies
from rnb.core.termination import COMPLETE_REASONS
from rnb.load import logged_mode

ARG_KEYS: tuple[str, ...] = ("videos", "batch_size", "queue_size", "warmup", "seed", "cpu", "log_dir")
JSON_COLUMNS: tuple[str, ...] = (  # JSON text cells
    "items_per_device", "peak_rss_bytes", "peak_device_bytes", "notes", "throughput_windows", "step_models",
    "busy_fraction", "cpu_percent", "run_wait_fraction", "stacks", "streams_record", "schedule_spans", "loadgen_result",
    "loadgen_log_result")
BOUNDED_PERCENTILE = 99.0   # VALID needs enough items to bound this percentile from above


@dataclass(frozen=True)
class ValidityRules:
    """RnB's own run rules, for a job without a LoadGen scenario: a result counts only if the run was long and full
    enough (a scenario's job is judged by LoadGen's rules instead: rnb.analysis.verdict)."""

    min_duration_s: float = 1.0
    min_items: int = 100
    min_frames_per_stream: int = 30   # a camera-stream job: frames each stream must offer (one second at 30 fps)
    confidence: float = CONFIDENCE   # of each percentile's interval; the p99's must have an upper end


class JobTables(NamedTuple):
    jobs: pa.Table    # one row per job
    items: pa.Table   # one row per finished item, all jobs


def check_validity(termination_reason: str, measured_items: int, duration_s: float, rules: ValidityRules) -> str | None:
    """None when the run is VALID by RnB's own rules, else the failed rules as one sentence."""
    failed = [ran_as_asked(termination_reason)]
    if measured_items < rules.min_items:
        failed.append(f"{measured_items} items after warm-up, fewer than --min-items {rules.min_items}")
    if duration_s < rules.min_duration_s:
        failed.append(f"the measured window lasted {duration_s:.3f} s, less than --min-duration {rules.min_duration_s:g} s")
    needed = min_items_for_upper_bound(BOUNDED_PERCENTILE, rules.confidence)
    if measured_items < needed:
        failed.append(f"{measured_items} items cannot bound the p{BOUNDED_PERCENTILE:g} from above at "
                      f"{rules.confidence:.0%} confidence, which takes at least {needed} "
                      f"({BOUNDED_PERCENTILE / 100:g}^n <= {(1 - rules.confidence) / 2:g})")
    reasons = [reason for reason in failed if reason]
    return "; ".join(reasons) + "." if reasons else None


def ran_as_asked(termination_reason: str) -> str | None:
    """Why a run that did not end at its target or its maximum duration (LoadGen's max_duration) is not one to
    judge; None for one that did."""
    if termination_reason in COMPLETE_REASONS:
        return None
    return f"the run ended with {termination_reason!r}, not {' or '.join(map(repr, COMPLETE_REASONS))}"


def measured_rows(job: Job) -> pa.Table:
    """The items after warm-up: the only ones LoadGen-style statistics may use."""
    return job.timings.filter(pc.invert(job.timings.column("is_warmup").fill_null(False)))


def e2e_percentile_ms(job: Job, percentile: float) -> float:
    """The job's end-to-end latency percentile after warm-up; infinite when no item counts.

    A run that did not reach its target has no meaningful tail, so it counts
    as infinitely slow for anyone comparing it against a latency bound.
    """
    measured = measured_rows(job)
    if job.meta.termination_reason not in COMPLETE_REASONS or measured.num_rows == 0:
        return math.inf
    return float(np.nanpercentile(part_latencies(measured, job.num_steps)[END_TO_END.key] * 1000.0, percentile))


@dataclass(frozen=True)
class MeasuredWindow:
    """The items after warm-up, the window from the first one's enqueue to the last one's finish, and the verdict."""

    items: int
    duration_s: float
    invalid_because: str | None   # None when the job is VALID, else why not, one sentence per failed rule
    overloaded: str | None = None   # an open loop served slower than offered (rnb.analysis.verdict.overloaded)
    scenario: Verdict | None = None   # a LoadGen scenario's job: LoadGen's rules for it


def measured_window(job: Job, measured: pa.Table, rules: ValidityRules) -> MeasuredWindow:
    """The window the measured items (measured_rows) span, and whether the job is VALID over it.

    A job of a LoadGen scenario is judged by LoadGen's rules for it; any
    other by RnB's own, an open loop's load also served as offered.
    """
    count = measured.num_rows
    duration = window_seconds(measured, job.num_steps) if count else 0.0
    args = job.meta.args
    verdict = scenario_verdict(args, measured, job.timings.num_rows, job.num_steps)
    if verdict is not None:
        failed = [ran_as_asked(job.meta.termination_reason), None if verdict.valid else verdict.failures()]
        return MeasuredWindow(count, duration, "; ".join(filter(None, failed)) or None, scenario=verdict)
    heavy = overloaded(args, measured, job.num_steps) if count else None
    failed = [check_validity(job.meta.termination_reason, count, duration, rules),
              few_frames(job.meta.streams, rules.min_frames_per_stream) if job.meta.streams else None,
              logged_mode(args).short_of_its_load(args, job.timings.num_rows), heavy]
    return MeasuredWindow(count, duration, " ".join(filter(None, failed)) or None, heavy)


def window_seconds(measured: pa.Table, num_steps: int) -> float:
    """How long the measured window lasted: from the first measured item's enqueue to the last one's finish.

    `measured` holds the measured items' enqueue and final handed-over columns
    (at least); the end-of-run summary's throughput and analyze.py's are this.
    """
    last_finish = np.nanmax(column_values(measured, StepEvents(num_steps - 1).handed_over))
    return float(last_finish - np.nanmin(column_values(measured, ENQUEUE)))


def summarize_job(job: Job, rules: ValidityRules) -> JobRow:
    """One row of the jobs table.

    The measured window runs from the first enqueue to the last finish of the
    items after warm-up; throughput, data rates and latencies use only those.
    """
    meta = job.meta
    args = meta.args
    measured = measured_rows(job)
    latencies = part_latencies(measured, job.num_steps)
    window = measured_window(job, measured, rules)
    count, duration, invalid = window.items, window.duration_s, window.invalid_because
    reason = meta.termination_reason
    row: JobRow = {
        "job_id": job.job_id,
        "job_dir": str(job.path),
        "config_path": meta.config_path,
        "config": config_name(meta.config_path),
        "batch_sizes": batch_sizes(job),
        **load_columns(args),
        **{key: args.get(key) for key in ARG_KEYS},
        "start_time": meta.start_time,
        "end_time": meta.end_time,
        "elapsed_s": meta.elapsed_s,
        "finished_items": meta.finished_items,
        "throughput_items_per_s": meta.throughput_items_per_s,
        "termination_reason": reason,
        "failed_process": meta.failed_process,
        "error": meta.error,
        "validity": "INVALID" if invalid else "VALID",
        "invalid_because": invalid,
        "loadgen_rules": None if window.scenario is None else window.scenario.rules_text(),
        "loadgen_result": None if window.scenario is None else json.dumps(dict(window.scenario.result)),
        "num_steps": job.num_steps,
        "step_models": step_models(job),
        "measured_items": count,
        "measured_duration_s": duration,
        "measured_throughput_items_per_s": count / duration if duration > 0 else None,
    }
    row.update(latency_columns(latencies, job.num_steps))
    row.update(data_columns(job, measured, duration))
    row.update(process_columns(job))
    row.update(loadgen_log_columns(job.path))
    row.update(stream_columns(meta.streams))
    row["schedule_spans"] = spans_of(job, measured)
    row.update(percentile_columns(latencies[END_TO_END.key], rules.confidence))
    row.update(throughput_columns(job))
    row.update(utilisation_columns(job))
    return row


def item_rows(job: Job) -> pa.Table:
    """The job's timings with its id in front and the derived latencies (ms) appended."""
    table = job.timings.add_column(0, "job_id", pa.array([job.job_id] * job.timings.num_rows, pa.string()))
    for name, seconds in part_latencies(job.timings, job.num_steps).items():
        table = table.append_column(f"{name}_ms", pa.array(seconds * 1000.0, pa.float64()))
    return table


def rows_to_table(rows: Iterable[JobRow]) -> pa.Table:
    """A table over the union of the rows' keys (jobs with more steps have more columns), nulls elsewhere."""
    rows = list(rows)
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return pa.Table.from_pydict({key: [row.get(key) for row in rows] for key in keys})


def load_jobs(
    log_dir: str | Path | Sequence[str | Path],
    names: Sequence[str] | None = None,
    rules: ValidityRules = ValidityRules(),
) -> JobTables:
    """All jobs of a log directory (or the job/log directories given), summarized and itemized."""
    paths = [log_dir] if isinstance(log_dir, (str, Path)) else list(log_dir)
    jobs = [read_job(path) for path in find_job_dirs(paths, names) if is_complete(path) or names is not None]
    if not jobs:
        raise JobLogError(f"{', '.join(str(p) for p in paths)}: holds no complete job (every job directory lacks "
                          "its meta.json).")
    items = pa.concat_tables([item_rows(job) for job in jobs], promote_options="default")
    return JobTables(rows_to_table(summarize_job(job, rules) for job in jobs), items)
