"""Load job logs (`<log-dir>/<job_id>/`) into tables a script or a person can use.

A job directory holds `config.json`, `meta.json` and `timings.parquet` (one row
per finished item). This module turns a set of them into two pyarrow tables:
one row per job (arguments, throughput, LoadGen-style validity, latency
percentiles end to end and per stage, data rates, memory peaks) and one row
per item (the raw timings plus the derived latencies in milliseconds), so that
every question about a run is a filter or a group-by away.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rnb.analysis.loadgen_log import loadgen_log_columns
from rnb.analysis.loadgen_rules import Verdict
from rnb.analysis.loads import spans_of
from rnb.analysis.stats import CONFIDENCE, min_items_for_upper_bound, percentile_bounds, steady_state, windowed_throughput
from rnb.analysis.streams import few_frames, stream_columns
from rnb.analysis.utilisation import utilisation_columns
from rnb.analysis.verdict import overloaded, scenario_verdict
from rnb.core.joblog import (
    CONFIG_FILE,
    META_FILE,
    SAMPLES_FILE,
    SPOOL_DIR,
    TIMINGS_FILE,
    config_name,
    read_json_object,
    read_meta,
)
from rnb.core.records import JobLogError, JobMeta, Json, JsonObject, json_at
from rnb.core.stages import END_TO_END, ENQUEUE, PARTS, StepEvents, part_key, part_latencies
from rnb.core.termination import COMPLETE_REASONS
from rnb.load import LOAD_KEYS, SCENARIO_KEYS, logged_mode

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
STAT_NAMES: tuple[str, ...] = ("min", "mean", *(f"p{q:g}".replace(".", "_") for q in PERCENTILES), "max")
ARG_KEYS: tuple[str, ...] = ("videos", "batch_size", "queue_size", "warmup", "seed", "cpu", "log_dir")
JOB_FILES: tuple[str, ...] = (META_FILE, CONFIG_FILE, TIMINGS_FILE, SPOOL_DIR)
JSON_COLUMNS: tuple[str, ...] = (  # JSON text cells
    "items_per_device", "peak_rss_bytes", "peak_device_bytes", "notes", "throughput_windows", "step_models",
    "busy_fraction", "cpu_percent", "run_wait_fraction", "stacks", "streams_record", "schedule_spans", "loadgen_result",
    "loadgen_log_result")
BOUNDED_PERCENTILE = 99.0   # VALID needs enough items to bound this percentile from above
# One row of the jobs table by column, as summarize_job builds it and Table.to_pylist() gives it back: numbers,
# strings, null, the job's settings as meta.json holds them, and the JSON_COLUMNS as JSON text.
JobRow: TypeAlias = dict[str, Json]


@dataclass(frozen=True)
class ValidityRules:
    """RnB's own run rules, for a job without a LoadGen scenario: a result counts only if the run was long and full
    enough (a scenario's job is judged by LoadGen's rules instead: rnb.analysis.verdict)."""

    min_duration_s: float = 1.0
    min_items: int = 100
    min_frames_per_stream: int = 30   # a camera-stream job: frames each stream must offer (one second at 30 fps)
    confidence: float = CONFIDENCE   # of each percentile's interval; the p99's must have an upper end


@dataclass(frozen=True)
class Job:
    """One job directory as read from disk, before any statistics."""

    job_id: str
    path: Path
    meta: JobMeta
    config: JsonObject
    timings: pa.Table
    num_steps: int
    samples: pa.Table | None = None   # samples.parquet; None for a job that has none (older logs)


@dataclass(frozen=True)
class IncompleteJob:
    """A job directory without meta.json: its job is still running, or its main process was killed."""

    job_id: str
    path: Path
    spooled_items: int   # finished items its main process had already streamed to disk


class JobTables(NamedTuple):
    jobs: pa.Table    # one row per job
    items: pa.Table   # one row per finished item, all jobs


def stat_column(prefix: str, stat: str) -> str:
    """The name of a latency statistic column, e.g. `e2e_p99_ms`, `queue1_p50_ms`."""
    return f"{prefix}_{stat}_ms"


def find_job_dirs(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> list[Path]:
    """Resolve each path as a job directory (it holds a job file) or a log directory of jobs.

    Subdirectories of a log directory that hold none of the job files are
    not jobs (e.g. a stray folder) and are skipped; `names` keeps only the job
    ids listed, and each listed id must exist.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise JobLogError(f"{path}: no such log or job directory.")
        if _is_job_dir(path):
            found.append(path)
            continue
        found.extend(sorted(child for child in path.iterdir() if child.is_dir() and _is_job_dir(child)))
    if names is not None:
        by_name = {job.name: job for job in found}
        missing = [name for name in names if name not in by_name]
        if missing:
            raise JobLogError(f"{', '.join(str(p) for p in paths)}: no job named {missing[0]!r}.")
        found = [by_name[name] for name in names]
    if not found:
        raise JobLogError(f"{', '.join(str(p) for p in paths)}: holds no job directories (none has a meta.json).")
    return found


def _is_job_dir(path: Path) -> bool:
    return any((path / name).exists() for name in JOB_FILES)


def is_complete(path: Path) -> bool:
    """Whether a job directory holds meta.json, the last file a job writes, and the timings it wrote before it.

    A log directory that filled up may have taken meta.json but refused the
    timings: the job's items are then in its spool, as a killed job's are.
    """
    return (path / META_FILE).is_file() and (path / TIMINGS_FILE).is_file()


def incomplete_job(path: Path) -> IncompleteJob:
    """What an incomplete job directory holds: the items spooled so far (a part cut short by a kill is skipped)."""
    rows = 0
    for part in sorted((path / SPOOL_DIR).glob("*.parquet")):
        try:
            rows += pq.read_metadata(part).num_rows
        except (OSError, pa.ArrowException):
            continue
    return IncompleteJob(path.name, path, rows)


def read_job(path: str | Path, columns: Callable[[int], Iterable[str]] | None = None) -> Job:
    """Read one job directory; any missing or unreadable file raises JobLogError naming it.

    `columns`, given the number of steps, names the timings columns to read
    besides those every job has (the rest are left on disk): what a caller
    that needs a few columns of a long job holds is those, not every row.
    """
    path = Path(path)
    meta = read_meta(path)
    config = read_json_object(path / CONFIG_FILE)
    timings_path = path / TIMINGS_FILE
    num_steps = meta.num_steps
    try:
        if columns is None:
            timings = pq.read_table(timings_path)
        else:  # a column at a time, on this thread: the reader's buffers for one column at once
            file = pq.ParquetFile(timings_path)
            wanted = ("item_id", "is_warmup", ENQUEUE, *_step_columns(num_steps), *columns(num_steps))
            timings = pa.table({name: file.read(columns=[name], use_threads=False).column(0)
                                for name in dict.fromkeys(wanted) if name in file.schema_arrow.names})
    except (OSError, pa.ArrowException) as exc:
        raise JobLogError(f"{timings_path}: cannot be read as Parquet ({exc}).") from exc
    for column in ("item_id", "is_warmup", ENQUEUE, *_step_columns(num_steps)):
        if column not in timings.column_names:
            raise JobLogError(f"{timings_path}: lacks the column {column!r}.")
    return Job(meta.job_id or path.name, path, meta, config, timings, num_steps, _read_samples(path))


def _read_samples(path: Path) -> pa.Table | None:
    samples_path = path / SAMPLES_FILE
    if not samples_path.is_file():
        return None
    try:
        return pq.read_table(samples_path)
    except (OSError, pa.ArrowException) as exc:
        raise JobLogError(f"{samples_path}: cannot be read as Parquet ({exc}).") from exc


def _step_columns(num_steps: int) -> list[str]:
    return [name for k in range(num_steps) for name in StepEvents(k).always]


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def latency_stats(seconds: np.ndarray) -> dict[str, float | None]:
    """min, mean, the PERCENTILES (numpy's linear interpolation) and max, in milliseconds."""
    ms = seconds[~np.isnan(seconds)] * 1000.0
    if ms.size == 0:
        return dict.fromkeys(STAT_NAMES)
    values = [float(ms.min()), float(ms.mean()), *(float(v) for v in np.percentile(ms, PERCENTILES)), float(ms.max())]
    return dict(zip(STAT_NAMES, values))


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
    last_finish = np.nanmax(_column(measured, StepEvents(num_steps - 1).handed_over))
    return float(last_finish - np.nanmin(_column(measured, ENQUEUE)))


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
    for prefix in (END_TO_END.key, *(part_key(part, k) for k in range(job.num_steps) for part in PARTS)):
        for stat, value in latency_stats(latencies[prefix]).items():
            row[stat_column(prefix, stat)] = value
    for field in ("bytes_fetched", "bytes_reused", "frames_decoded"):
        row[f"{field}_per_s"] = _rate(measured, field, duration)
    row["items_per_device"] = json.dumps(_items_per_device(job))
    rss = {p.name: p.peak_rss_bytes for p in meta.processes if p.peak_rss_bytes is not None}
    device_bytes = {p.name: p.peak_device_bytes for p in meta.processes if p.peak_device_bytes is not None}
    row["peak_rss_bytes"] = json.dumps(rss)
    row["max_peak_rss_bytes"] = max(rss.values(), default=None)
    row["peak_device_bytes"] = json.dumps(device_bytes)
    row["max_peak_device_bytes"] = max(device_bytes.values(), default=None)
    row["notes"] = json.dumps(list(meta.notes))
    # A stalled job's Python stacks, by process: files under the job directory, wherever the log has moved since.
    stacks = {p.name: str(job.path / p.stacks) for p in meta.processes if p.stacks}
    row["stacks"] = json.dumps(stacks) if stacks else None
    row.update(loadgen_log_columns(job.path))
    row.update(stream_columns(meta.streams))
    row["schedule_spans"] = spans_of(job, measured)
    row.update(percentile_columns(latencies[END_TO_END.key], rules.confidence))
    row.update(throughput_columns(job))
    row.update(utilisation_columns(job))
    return row


def step_models(job: Job) -> str:
    """Each step's model as the config names it (dotted class path), as JSON text: what each step ran."""
    return json.dumps([json_at(job.config, "pipeline", k, "model") for k in range(job.num_steps)])


def bound_column(stat: str, end: str) -> str:
    """The column of one end ("low" or "high") of a percentile's confidence interval, e.g. `e2e_p99_high_ms`."""
    return stat_column(END_TO_END.key, f"{stat}_{end}")


def percentile_columns(e2e_s: np.ndarray, confidence: float) -> dict[str, float | None]:
    """Each end-to-end percentile's order-statistic interval, in ms; None where the items cannot bound it."""
    row: dict[str, float | None] = {"confidence": confidence}
    for q, stat in zip(PERCENTILES, STAT_NAMES[2:]):
        bounds = percentile_bounds(e2e_s * 1000.0, q, confidence)
        row[bound_column(stat, "low")] = None if bounds is None else bounds.low
        row[bound_column(stat, "high")] = None if bounds is None else bounds.high
    return row


def throughput_columns(job: Job) -> JobRow:
    """Finished items per second over windows of the job's elapsed time, and the steady stretch among them."""
    start, end = job.meta.start_time, job.meta.end_time
    row: JobRow = dict.fromkeys(("throughput_window_s", "throughput_windows", "steady_start_s",
                                 "steady_end_s", "steady_throughput_items_per_s"))
    if start is None or end is None or end <= start:
        return row
    series = windowed_throughput(_column(job.timings, StepEvents(job.num_steps - 1).handed_over).astype(float), start, end)
    steady = steady_state(series)
    row.update(throughput_window_s=series.window_s, throughput_windows=json.dumps(series.rates.tolist()))
    if steady is not None:
        row.update(steady_start_s=steady.start_s, steady_end_s=steady.end_s,
                   steady_throughput_items_per_s=steady.throughput)
    return row


def load_columns(args: Mapping[str, Json]) -> JobRow:
    """The job's load mode and its keys; null where the mode ignores a key (-mi in a closed loop)."""
    mode = logged_mode(args)
    used = {key.name for key in mode.keys} | ({key.name for key in SCENARIO_KEYS} if args.get("scenario") else set())
    return {"load_mode": mode.name, **{key: args.get(key) if key in used else None for key in LOAD_KEYS}}


def batch_sizes(job: Job) -> str:
    """The largest batch each step's outputs held, step by step: `1/4/4` for a loader, a Batcher of 4 and a
    network after it; `-` for a step whose log has no batch_size column.

    What the runners did, read from the timings, not the -b flag (a config's
    `batch` overrides it, and only batching steps take it).
    """
    sizes = []
    for k in range(job.num_steps):
        column = f"batch_size{k}"
        found = pc.max(job.timings.column(column)).as_py() if column in job.timings.column_names else None
        sizes.append("-" if found is None else str(found))
    return "/".join(sizes)


def _rate(measured: pa.Table, field: str, duration: float) -> float | None:
    if field not in measured.column_names or duration <= 0:
        return None
    values = measured.column(field).drop_null()
    if len(values) == 0:
        return None
    return float(np.sum(values.to_numpy(zero_copy_only=False))) / duration


def _items_per_device(job: Job) -> dict[str, dict[str, int]]:
    """Finished items (warm-up included) per device for each step: how the load was spread."""
    spread: dict[str, dict[str, int]] = {}
    for k in range(job.num_steps):
        column = f"device{k}"
        if column not in job.timings.column_names:
            continue
        counts = job.timings.column(column).value_counts()
        spread[str(k)] = {str(entry["values"]): int(entry["counts"]) for entry in counts.to_pylist()}
    return spread


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
