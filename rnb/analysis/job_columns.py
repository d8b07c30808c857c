"""The columns of a job's row beyond its settings and verdict: latency statistics and their intervals, throughput
over time, the load's keys, batches, data rates, the spread over devices, memory peaks."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rnb.analysis.job_dirs import Job
from rnb.analysis.stats import percentile_bounds, steady_state, windowed_throughput
from rnb.core.records import Json, json_at
from rnb.core.stages import END_TO_END, PARTS, StepEvents, part_key
from rnb.load import LOAD_KEYS, SCENARIO_KEYS, logged_mode

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
STAT_NAMES: tuple[str, ...] = ("min", "mean", *(f"p{q:g}".replace(".", "_") for q in PERCENTILES), "max")
# One row of the jobs table by column, as summarize_job builds it and Table.to_pylist() gives it back: numbers,
# strings, null, the job's settings as meta.json holds them, and the JSON_COLUMNS as JSON text.
JobRow: TypeAlias = dict[str, Json]


def stat_column(prefix: str, stat: str) -> str:
    """The name of a latency statistic column, e.g. `e2e_p99_ms`, `queue1_p50_ms`."""
    return f"{prefix}_{stat}_ms"


def column_values(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def latency_stats(seconds: np.ndarray) -> dict[str, float | None]:
    """min, mean, the PERCENTILES (numpy's linear interpolation) and max, in milliseconds."""
    ms = seconds[~np.isnan(seconds)] * 1000.0
    if ms.size == 0:
        return dict.fromkeys(STAT_NAMES)
    values = [float(ms.min()), float(ms.mean()), *(float(v) for v in np.percentile(ms, PERCENTILES)), float(ms.max())]
    return dict(zip(STAT_NAMES, values))


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
    series = windowed_throughput(column_values(job.timings, StepEvents(job.num_steps - 1).handed_over).astype(float), start, end)
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


def data_rate(measured: pa.Table, field: str, duration: float) -> float | None:
    if field not in measured.column_names or duration <= 0:
        return None
    values = measured.column(field).drop_null()
    if len(values) == 0:
        return None
    return float(np.sum(values.to_numpy(zero_copy_only=False))) / duration


def items_per_device(job: Job) -> dict[str, dict[str, int]]:
    """Finished items (warm-up included) per device for each step: how the load was spread."""
    spread: dict[str, dict[str, int]] = {}
    for k in range(job.num_steps):
        column = f"device{k}"
        if column not in job.timings.column_names:
            continue
        counts = job.timings.column(column).value_counts()
        spread[str(k)] = {str(entry["values"]): int(entry["counts"]) for entry in counts.to_pylist()}
    return spread


def latency_columns(latencies: Mapping[str, np.ndarray], num_steps: int) -> JobRow:
    """The latency statistics (ms) end to end and of every part of every step, from part_latencies' seconds."""
    row: JobRow = {}
    for prefix in (END_TO_END.key, *(part_key(part, k) for k in range(num_steps) for part in PARTS)):
        for stat, value in latency_stats(latencies[prefix]).items():
            row[stat_column(prefix, stat)] = value
    return row


def data_columns(job: Job, measured: pa.Table, duration: float) -> JobRow:
    """Bytes fetched and reused and frames decoded per second of the measured window, and items per device."""
    row: JobRow = {f"{field}_per_s": data_rate(measured, field, duration)
                   for field in ("bytes_fetched", "bytes_reused", "frames_decoded")}
    row["items_per_device"] = json.dumps(items_per_device(job))
    return row


def process_columns(job: Job) -> JobRow:
    """Each process's peak RSS and device memory (JSON text) and the largest of each, the job's notes, and where a
    stalled job's Python stacks are."""
    processes = job.meta.processes
    rss = {p.name: p.peak_rss_bytes for p in processes if p.peak_rss_bytes is not None}
    device_bytes = {p.name: p.peak_device_bytes for p in processes if p.peak_device_bytes is not None}
    # The stacks by process: files under the job directory, wherever the log has moved since.
    stacks = {p.name: str(job.path / p.stacks) for p in processes if p.stacks}
    return {"peak_rss_bytes": json.dumps(rss), "max_peak_rss_bytes": max(rss.values(), default=None),
            "peak_device_bytes": json.dumps(device_bytes), "max_peak_device_bytes": max(device_bytes.values(), default=None),
            "notes": json.dumps(list(job.meta.notes)), "stacks": json.dumps(stacks) if stacks else None}
