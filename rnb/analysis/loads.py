"""A job's load as the tables and pages name it: its mode and its figures, in a few words.

The jobs table holds the load as its keys (`load_mode`, `mean_interval_ms`,
`streams`, ...); a person reading a table of jobs wants them as one cell:
`poisson 333/s`, `4 x 30 fps, drop`, `schedule 100@10s,300@5s`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rnb.core.records import JsonObject
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.load import Span, logged_settings, mode_of, parse_schedule

if TYPE_CHECKING:  # jobs.py builds its table with this module
    from rnb.analysis.job_dirs import Job


def load_words(row: Mapping[str, Any]) -> str:
    """The load of a jobs-table row (or meta.json's args) in a few words; a log without load keys ran the defaults."""
    settings = logged_settings(row)
    mode = mode_of(settings).name
    if mode == "poisson":
        return f"poisson {1000.0 / settings.mean_interval_ms:.4g}/s"
    if mode == "bulk":
        return "bulk (all at once)"
    if mode == "closed_loop":
        return f"closed loop, {settings.concurrency} in flight"
    if mode == "streams":
        return f"{settings.streams} x {settings.fps:g} fps, {settings.stream_policy}"
    if mode == "trace":
        return f"trace {Path(str(settings.arrivals)).name}"
    return f"schedule {settings.rate_schedule}"


def span_label(span: Span) -> str:
    """A span as a schedule spells it: `300@5s`, `100-300@10s`."""
    rates = f"{span.start:g}" + (f"-{span.end:g}" if span.end != span.start else "")
    return f"{rates}@{span.seconds:g}s"


def spans_of(job: Job, measured: pa.Table) -> str | None:
    """A rate schedule's spans as its measured items met them (schedule_spans), as JSON text; None for any other
    load."""
    schedule = logged_settings(job.meta.args).rate_schedule
    start, end = job.meta.start_time, job.meta.end_time
    if schedule is None or start is None or end is None:
        return None
    enqueued, finished = (measured.column(name).to_numpy(zero_copy_only=False).astype(float) - start
                          for name in (ENQUEUE, StepEvents(job.num_steps - 1).handed_over))
    return json.dumps(schedule_spans(schedule, enqueued, finished, end - start))


def schedule_spans(schedule: str, enqueued_s: np.ndarray, finished_s: np.ndarray, run_s: float) -> list[JsonObject]:
    """Each span of a rate schedule over a job's run: the rate it asks, the requests sent in it, the items served in
    it per second, and the p99 latency of its requests; times in seconds after the job's start.

    A schedule has no steady state: each span is a load of its own, repeated
    every cycle, so each is measured over all its repetitions within the run.
    """
    spans = parse_schedule(schedule)
    cycle = sum(span.seconds for span in spans)
    # The client may send its first request a hair before the main process stamps the start: it belongs to the first.
    enqueued_s, finished_s = np.maximum(enqueued_s, 0.0), np.maximum(finished_s, 0.0)   # NaN stays NaN
    latency_ms = (finished_s - enqueued_s) * 1000.0
    figures: list[JsonObject] = []
    offset = 0.0
    for span in spans:
        starts = np.arange(offset, max(run_s, offset + 1e-9), cycle)
        covered = float(np.sum(np.clip(run_s - starts, 0.0, span.seconds)))
        sent = _within(enqueued_s, span.seconds, cycle, offset)
        served = int(np.count_nonzero(_within(finished_s, span.seconds, cycle, offset)))
        mine = latency_ms[sent & ~np.isnan(latency_ms)]
        figures.append({"span": span_label(span), "begins_s": offset, "asked_per_s": (span.start + span.end) / 2,
                        "requests": int(np.count_nonzero(sent)),
                        "served_per_s": served / covered if covered > 0 else None,
                        "p99_ms": float(np.percentile(mine, 99)) if mine.size else None})
        offset += span.seconds
    return figures


def _within(times: np.ndarray, seconds: float, cycle: float, offset: float) -> np.ndarray:
    """Which times fall inside one of a span's repetitions (each `seconds` long from `offset` in every cycle)."""
    with np.errstate(invalid="ignore"):
        return (times >= offset) & (np.mod(times - offset, cycle) < seconds)


SPAN_HEADER: tuple[str, ...] = ("span", "from s in each cycle", "asked req/s", "requests", "served req/s", "p99 ms")


def span_rows(spans: list[JsonObject]) -> list[list[str]]:
    """A rate schedule's spans (schedule_spans) as cells under SPAN_HEADER."""
    def cell(value: object, digits: str = ".4g") -> str:
        return "-" if not isinstance(value, (int, float)) else format(value, digits)

    return [[str(span["span"]), cell(span["begins_s"], "g"), cell(span["asked_per_s"]), str(span["requests"]),
             cell(span["served_per_s"]), cell(span["p99_ms"], ".3g")] for span in spans]


def spans_sentence(spans: list[JsonObject]) -> str:
    """A rate schedule's spans in one line: what each asked and served, and its p99."""
    rows = span_rows(spans)
    return ("rate schedule, each span over its repetitions (asked -> served req/s, p99): "
            + "; ".join(f"{span} {asked} -> {served}, {p99} ms" for span, _, asked, _, served, p99 in rows))
