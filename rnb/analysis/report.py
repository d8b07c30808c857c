"""Human-facing views of the jobs table: terminal tables, a two-job comparison, load curves (rnb.analysis.plots
draws them).

Everything here reads the table that `rnb.analysis.load_jobs` returns, so a
script that loads the table itself sees exactly the numbers a person sees.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import pyarrow as pa

from rnb.analysis.bound import STARVED, JobBound
from rnb.analysis.job_columns import STAT_NAMES, bound_column, stat_column
from rnb.analysis.loads import load_words, spans_sentence
from rnb.analysis.streams import format_streams
from rnb.core.records import Json
from rnb.core.stages import END_TO_END, PARTS, part_key
from rnb.load import logged_mode

# A row of a table as Table.to_pylist() gives it (a jobs row, a sample): each value of its column's type, which
# pyarrow, shipping no type information, does not tell; summarize_job's rows (rnb.analysis.jobs.JobRow) are one.
TableRow: TypeAlias = Mapping[str, Any]
# A colour as matplotlib's colormaps give it: red, green, blue, alpha.
Colour: TypeAlias = tuple[float, float, float, float]

E2E = END_TO_END.key
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("job", "job_id"),
    ("config", "config"),
    ("batch", "batch_sizes"),
    ("load", "load"),
    ("reason", "termination_reason"),
    ("validity", "validity"),
    ("items", "measured_items"),
    ("window s", "measured_duration_s"),
    ("items/s", "measured_throughput_items_per_s"),
    ("p50 ms", stat_column(E2E, "p50")),
    ("p99 ms", stat_column(E2E, "p99")),
    ("p99.9 ms", stat_column(E2E, "p99_9")),
    ("max ms", stat_column(E2E, "max")),
    ("missed (late/dropped)", "frames_missed"),
    ("bottleneck", "bottleneck"),
    ("peak RSS MiB", "max_peak_rss_bytes"),
    ("peak dev MiB", "max_peak_device_bytes"),
)
STAGE_STATS: tuple[str, ...] = ("mean", "p50", "p99", "max")
# Stage means further apart than this cannot share a linear stacked bar: the smaller ones would not show.
MAX_LINEAR_SPREAD = 100.0
COMPARE_FIELDS: tuple[str, ...] = (
    "load_mode", "mean_interval_ms", "concurrency", "streams", "fps", "stream_policy", "deadline_ms", "arrivals",
    "rate_schedule", "videos", "batch_size", "measured_items", "measured_duration_s",
    "throughput_items_per_s", "measured_throughput_items_per_s",
    *(stat_column(E2E, s) for s in ("min", "mean", "p50", "p90", "p95", "p99", "p99_9", "max")),
    "frames_offered", "frames_processed", "frames_late", "frames_dropped", "frames_missed_fraction",
    "busiest_step", "busiest_busy_fraction", "bottleneck_step",
    "bytes_fetched_per_s", "bytes_reused_per_s", "frames_decoded_per_s", "max_peak_rss_bytes", "max_peak_device_bytes",
)


def _cell(value: Json, column: str = "") -> str:
    if value is None:
        return "-"
    if column.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(jobs: pa.Table) -> str:
    """One line per job: the numbers a reader looks at first, then why any job is INVALID."""
    records = jobs.to_pylist()
    rows = [[_cell({**r, **_told(r)}.get(column), column) for _, column in SUMMARY_COLUMNS] for r in records]
    text = _grid([title for title, _ in SUMMARY_COLUMNS], rows)
    reasons = [f"  {r['job_id']}: INVALID: {r['invalid_because']}" for r in records if r["invalid_because"]]
    # meta.json's error is already the whole sentence (it names the failed process): say it once.
    errors = [f"  {r['job_id']}: {r['error']}" for r in records if r.get("error")]
    stacks = [_stacks_line(r) for r in records if r.get("stacks")]
    return "\n".join([text, *reasons, *errors, *stacks])


def _told(job: TableRow) -> dict[str, str | None]:
    """The summary's cells that the jobs table holds as several columns: the load, the frames missed, the bound."""
    bound = JobBound.of(job)
    missed = (None if job.get("frames_offered") is None else
              f"{job['frames_missed_fraction'] or 0:.1%} ({bound.late}/{bound.dropped})")
    if bound.busy is None:
        neck = None
    elif bound.saturated or bound.host_stall:
        neck = f"{'step' if bound.saturated else 'host stall, step'} {bound.step} {bound.busy:.0%}"
    else:
        neck = f"none (step {bound.step} {bound.busy:.0%})"
    return {"load": load_words(job), "frames_missed": missed, "bottleneck": neck}


def _stacks_line(job: TableRow) -> str:
    """Where a stalled job's Python stacks are: the stalled process's file first."""
    files = json.loads(job["stacks"])
    first = job["failed_process"] if job["failed_process"] in files else next(iter(files))
    others = f", beside those of {len(files) - 1} other processes" if len(files) > 1 else ""
    return f"  {job['job_id']}: Python stacks of {first}: {files[first]}{others}"


STAGE_HEADER: tuple[str, ...] = ("step", "stage", *(f"{s} ms" for s in STAGE_STATS))


def stage_rows(job: TableRow) -> list[list[str]]:
    """Each part of each step of one job row, then end to end: the cells under STAGE_HEADER."""
    rows = []
    for k in range(job["num_steps"]):
        for part in PARTS:
            stats = (_cell(job.get(stat_column(part_key(part, k), s))) for s in STAGE_STATS)
            rows.append([f"step {k}", part.name, *stats])
    rows.append(["all", END_TO_END.name, *(_cell(job.get(stat_column(E2E, s))) for s in STAGE_STATS)])
    return rows


def device_spread(job: TableRow) -> str:
    """How many items each device ran, step by step."""
    devices = json.loads(job.get("items_per_device") or "{}")
    return "; ".join(f"step {k}: " + ", ".join(f"{d} {n}" for d, n in counts.items()) for k, counts in devices.items())


def format_stages(job: TableRow) -> str:
    """Per-stage breakdown of one job row: each part of each step, then end to end."""
    header = f"{job['job_id']} (items per device: {device_spread(job) or '-'})"
    return header + "\n" + _grid(STAGE_HEADER, stage_rows(job))


def format_percentiles(job: TableRow) -> str:
    """Each end-to-end percentile with its confidence interval; '-' marks an end the items cannot bound."""
    cells = []
    for stat in STAT_NAMES[2:-1]:
        value = job.get(stat_column(E2E, stat))
        if value is not None:
            low, high = (_cell(job.get(bound_column(stat, end))) for end in ("low", "high"))
            cells.append(f"{stat.replace('_', '.')} {value:.3g} [{low}, {high}]")
    return (f"end-to-end ms with {job['confidence']:.0%} confidence intervals from order statistics: "
            + ("; ".join(cells) or "-"))


def format_utilisation(job: TableRow) -> str:
    """Throughput over time and its steady stretch, each runner's busy fraction and CPU use, the bottleneck."""
    return "\n".join(utilisation_lines(job))


def utilisation_lines(job: TableRow) -> list[str]:
    """format_utilisation's lines, one statement each."""
    lines = []
    if job.get("schedule_spans"):   # each span is a load of its own: a schedule has no steady state
        lines.append(spans_sentence(json.loads(job["schedule_spans"])))
    elif job.get("throughput_windows"):
        windows = len(json.loads(job["throughput_windows"]))
        steady = ("none found" if job.get("steady_start_s") is None else
                  f"{job['steady_start_s']:.3g}-{job['steady_end_s']:.3g} s at "
                  f"{job['steady_throughput_items_per_s']:.4g} items/s")
        lines.append(f"throughput over {windows} windows of {job['throughput_window_s']:.3g} s; steady state: {steady}")
    busy, cpu = json.loads(job.get("busy_fraction") or "{}"), json.loads(job.get("cpu_percent") or "{}")
    waits = json.loads(job.get("run_wait_fraction") or "{}")
    runners = [f"{name} busy {fraction:.0%}" + (f", cpu {cpu[name]:.0f}%" if name in cpu else "")
               + (f", waited for a core {waits[name]:.0%}" if waits.get(name, 0.0) >= STARVED else "")
               for name, fraction in busy.items()]
    if runners:
        lines.append("runners (time inside the model / elapsed): " + "; ".join(runners))
    if job.get("energy_per_item_j") is not None:
        lines.append(f"energy: {job['energy_per_item_j']:.4g} J per item (the GPUs' sampled board power over the job)")
    if job.get("busiest_step") is not None:
        lines.append("bottleneck: " + JobBound.of(job).words())
    return lines


def verdict_lines(job: TableRow) -> list[str]:
    """Whose rules judged the job and how, each rule named with yes or no; for a job LoadGen drove, LoadGen's own
    verdict and figures from its log beside RnB's (the end-of-run summary's last lines, and analyze.py's)."""
    why = job.get("invalid_because")
    if not job.get("loadgen_rules"):
        return [f"verdict: {job['validity']} by RnB's rules" + (f": {why}" if why else "")]
    # A run that did not end as asked says so before its rules' reasons (rnb.analysis.jobs.measured_window).
    ended = f" ({why.split('; by LoadGen')[0].rstrip('.')})" if why and why.startswith("the run ended") else ""
    lines = [f"verdict: {job['validity']} by LoadGen's {job['scenario']} rules: {job['loadgen_rules']}{ended}",
             f"result by LoadGen's rules, RnB's figures: {_figures(job.get('loadgen_result'))}"]
    if job.get("loadgen_log_validity"):
        lines.append(f"LoadGen's own verdict ({job['loadgen_log_samples']} samples, its log): "
                     f"{job['loadgen_log_validity']}: {job['loadgen_log_rules']}; its figures: "
                     f"{_figures(job.get('loadgen_log_result'))}")
    return lines


def _figures(text: str | None) -> str:
    figures = json.loads(text) if text else {}
    return "; ".join(f"{name} {value:.4g}" for name, value in figures.items()) or "-"


def format_report(jobs: pa.Table) -> str:
    """The whole terminal report: the summary table, then each job's stages, percentiles, utilisation and verdict."""
    sections = ["\n".join(filter(None, (format_stages(job), format_percentiles(job), _streams_text(job),
                                        format_utilisation(job), "\n".join(verdict_lines(job)))))
                for job in jobs.to_pylist()]
    return "\n\n".join([format_summary(jobs), *sections])


def _streams_text(job: TableRow) -> str:
    """A camera-stream job's frames, as its summary shows them; '' for any other job."""
    record = job.get("streams_record")
    return format_streams(json.loads(record)) if record else ""


def format_compare(job_a: TableRow, job_b: TableRow) -> str:
    """Two job rows side by side; the ratio is B / A, so >1 means B is larger."""
    fields = [*COMPARE_FIELDS]
    steps = max(job_a["num_steps"], job_b["num_steps"])
    fields += [stat_column(part_key(part, k), s) for k in range(steps) for part in PARTS for s in ("mean", "p99")]
    rows = [
        ["config_path", str(job_a.get("config_path")), str(job_b.get("config_path")), ""],
        ["termination_reason", job_a["termination_reason"], job_b["termination_reason"], ""],
        ["validity", job_a["validity"], job_b["validity"], ""],
    ]
    for field in fields:
        a, b = job_a.get(field), job_b.get(field)
        ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
        # Byte counts read as MiB, as in the summary table; the name says so.
        name = field.removesuffix("_bytes") + " MiB" if field.endswith("_bytes") else field
        rows.append([name, _cell(a, field), _cell(b, field), ratio])
    return _grid(["metric", f"A {job_a['job_id']}", f"B {job_b['job_id']}", "B/A"], rows)


class LoadPoint(NamedTuple):
    """One job on a throughput-against-p99 curve."""

    label: str          # its load: "mi 5", "c 8"
    throughput: float   # measured items/s
    p99_ms: float
    valid: bool         # an INVALID job is drawn, and marked as such


def load_curves(jobs: pa.Table) -> dict[str, list[LoadPoint]]:
    """For each config and load mode run at two or more loads: its jobs' points, lightest load first.

    Open-loop loads are Poisson intervals, where bulk runs (-mi 0) are the
    heaviest load there is and come last; closed-loop loads are
    concurrencies, a curve of their own, since -mi means nothing there.
    """
    curves: dict[str, list[tuple[float, LoadPoint]]] = {}   # (order, point)
    for job in jobs.to_pylist():
        throughput, p99 = job["measured_throughput_items_per_s"], job[stat_column(E2E, "p99")]
        if throughput is None or p99 is None:
            continue
        point = logged_mode(job).curve_point(job)
        load = LoadPoint(point.label, throughput, p99, job.get("validity") != "INVALID")
        curves.setdefault(Path(str(job["config_path"])).name + point.curve, []).append((point.order, load))
    return {config: [point for _, point in sorted(points, key=lambda pair: pair[0])]
            for config, points in curves.items() if len({order for order, _ in points}) >= 2}
