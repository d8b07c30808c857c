"""Human-facing views of the jobs table: terminal tables, a two-job comparison, plots.

Everything here reads the table that `rnb.analysis.load_jobs` returns, so a
script that loads the table itself sees exactly the numbers a person sees.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from rnb.analysis.bound import JobBound
from rnb.analysis.jobs import STAT_NAMES, bound_column, stat_column
from rnb.analysis.loads import load_words
from rnb.analysis.streams import format_streams, per_stream_missed
from rnb.core.joblog import SAMPLES_FILE
from rnb.core.records import Json
from rnb.core.stages import END_TO_END, PARTS, part_key
from rnb.load import logged_mode

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn: only plotting pays for the slow import
    from matplotlib.axes import Axes

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
MAX_TIME_ROWS = 6   # jobs drawn over time under the latency bars; more would make the figure unreadable
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
    if job.get("throughput_windows"):
        windows = len(json.loads(job["throughput_windows"]))
        steady = ("none found" if job.get("steady_start_s") is None else
                  f"{job['steady_start_s']:.3g}-{job['steady_end_s']:.3g} s at "
                  f"{job['steady_throughput_items_per_s']:.4g} items/s")
        lines.append(f"throughput over {windows} windows of {job['throughput_window_s']:.3g} s; steady state: {steady}")
    busy, cpu = json.loads(job.get("busy_fraction") or "{}"), json.loads(job.get("cpu_percent") or "{}")
    runners = [f"{name} busy {fraction:.0%}" + (f", cpu {cpu[name]:.0f}%" if name in cpu else "")
               for name, fraction in busy.items()]
    if runners:
        lines.append("runners (time inside the model / elapsed): " + "; ".join(runners))
    if job.get("energy_per_item_j") is not None:
        lines.append(f"energy: {job['energy_per_item_j']:.4g} J per item (the GPUs' sampled board power over the job)")
    if job.get("busiest_step") is not None:
        lines.append("bottleneck: " + JobBound.of(job).words())
    return lines


def format_report(jobs: pa.Table) -> str:
    """The whole terminal report: the summary table, then each job's stages, percentiles and utilisation."""
    sections = ["\n".join(filter(None, (format_stages(job), format_percentiles(job), _streams_text(job),
                                        format_utilisation(job))))
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


def _stream_lateness(axes: Axes, jobs: list[TableRow]) -> None:
    """Per stream of each camera-stream job: the fraction of its frames late, and above it the fraction dropped."""
    width = 0.8 / len(jobs)
    for index, job in enumerate(jobs):
        fractions = per_stream_missed(json.loads(job["streams_record"]))
        xs = [stream + index * width for stream in range(len(fractions))]
        late = [100 * late for late, _ in fractions]
        axes.bar(xs, late, width, label=f"{job['job_id']} late")
        axes.bar(xs, [100 * dropped for _, dropped in fractions], width, bottom=late, hatch="//", alpha=0.5,
                 label=f"{job['job_id']} dropped")
    axes.set_xlabel("stream")
    axes.set_ylabel("% of frames offered")
    axes.set_title("late and dropped frames per stream", fontsize=9)
    axes.legend(fontsize=7)


def stage_colours(num_steps: int) -> list[Colour]:
    """One distinct colour per (step, stage part), in stacking order."""
    import matplotlib

    count = num_steps * len(PARTS)
    if count <= 20:
        return [matplotlib.colormaps["tab20"](index) for index in range(count)]
    return [matplotlib.colormaps["turbo"](index / (count - 1)) for index in range(count)]


def _stage_bars(axis: Axes, records: list[TableRow]) -> None:
    """Each job's mean stage times, stacked; side by side on a log axis where they span more than MAX_LINEAR_SPREAD."""
    steps = max(r["num_steps"] for r in records)
    series = [(f"step {k} {part.name}", [r.get(stat_column(part_key(part, k), "mean")) or 0.0 for r in records])
              for k in range(steps) for part in PARTS]
    shown = [height for _, heights in series for height in heights if height > 0]
    side_by_side = bool(shown) and max(shown) > MAX_LINEAR_SPREAD * min(shown)
    positions = list(range(len(records)))
    width = 0.8 / len(series)
    bottoms = [0.0] * len(records)
    for index, ((label, heights), colour) in enumerate(zip(series, stage_colours(steps))):
        if side_by_side:
            axis.bar([p - 0.4 + (index + 0.5) * width for p in positions], heights, width=width, label=label, color=colour)
        else:
            axis.bar(positions, heights, bottom=bottoms, label=label, color=colour)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    if side_by_side:
        axis.set_yscale("log")
    axis.set_ylabel("mean latency (ms, log scale)" if side_by_side else "mean latency (ms)")
    axis.set_title("latency by stage, side by side" if side_by_side else "end-to-end latency by stage")
    axis.set_xticks(positions, [r["job_id"] for r in records], rotation=30, ha="right", fontsize=7)
    axis.legend(fontsize=7)


def _load_curves(axis: Axes, curves: dict[str, list[LoadPoint]]) -> None:
    invalid = False
    for config, points in curves.items():
        axis.plot([p.throughput for p in points], [p.p99_ms for p in points], marker="o", label=config)
        for point in points:
            axis.annotate(point.label if point.valid else f"{point.label} INVALID", (point.throughput, point.p99_ms),
                          fontsize=7)
        wrong = [p for p in points if not p.valid]
        if wrong:   # a hollow red ring around each: its p99 is a guess (analyze's table says why)
            axis.scatter([p.throughput for p in wrong], [p.p99_ms for p in wrong], s=140, facecolors="none",
                         edgecolors="red", zorder=3, label=None if invalid else "INVALID job")
            invalid = True
    axis.set_xlabel("throughput (items/s)")
    axis.set_ylabel("p99 end-to-end latency (ms)")
    axis.set_title("throughput against p99 latency")
    axis.legend(fontsize=7)


def _over_time(axes: Sequence[Axes], job: TableRow) -> None:
    """One job's throughput windows (steady state shaded), each process's CPU use and memory, GPU use if any."""
    throughput, cpu, memory = axes
    rates = json.loads(job.get("throughput_windows") or "[]")
    width = job.get("throughput_window_s") or 0.0
    if rates:   # the last window's rate holds until the job's end
        throughput.step([index * width for index in range(len(rates) + 1)], rates + rates[-1:], where="post")
    else:   # a job that counted no item in its measured window (one that stalled at once, or one too short)
        throughput.text(0.5, 0.5, "no throughput windows", ha="center", va="center", transform=throughput.transAxes,
                        fontsize=8)
    if job.get("steady_start_s") is not None:
        throughput.axvspan(job["steady_start_s"], job["steady_end_s"], alpha=0.2, label="steady state")
        throughput.legend(fontsize=7)
    throughput.set_title(f"{job['job_id']}:\nitems/s over time", fontsize=8)   # a job id is as wide as the axes
    throughput.set_xlabel("s after start", fontsize=7)
    samples_path = Path(job["job_dir"]) / SAMPLES_FILE
    samples = pq.read_table(samples_path).to_pylist() if samples_path.is_file() else []
    start, end = job.get("start_time") or 0.0, job.get("end_time") or math.inf
    by_process: dict[str, list[TableRow]] = {}
    for row in (row for row in samples if start <= row["time"] <= end):   # the run, not start-up
        by_process.setdefault(row["process"] or f"gpu {row['gpu']}", []).append(row)
    for name, rows in by_process.items():
        times = [row["time"] - start for row in rows]
        if rows[0]["process"] is None:
            cpu.plot(times, [row["gpu_util_percent"] for row in rows], linestyle="--", label=f"{name} util")
            cpu.plot(times, [row["nvdec_util_percent"] for row in rows], linestyle=":", label=f"{name} nvdec")
            memory.plot(times, [row["gpu_memory_used_bytes"] / 2**20 for row in rows], linestyle="--", label=name)
            continue
        busy = [100.0 * (b["cpu_s"] - a["cpu_s"]) / (b["time"] - a["time"]) for a, b in zip(rows, rows[1:])]
        cpu.plot(times[1:], busy, label=name)
        memory.plot(times, [row["rss_bytes"] / 2**20 for row in rows], label=name)
    cpu.set_title("CPU % (of one core), GPU and NVDEC %", fontsize=8)
    memory.set_title("RSS and GPU memory (MiB)", fontsize=8)
    for axis in (cpu, memory):
        axis.set_xlabel("s after start", fontsize=7)
        if by_process:
            axis.legend(fontsize=6)


def left_out_sentence(command: str, left_out: list[str]) -> str | None:
    """What a --plot that left jobs' time rows out says on stderr (the figure's title says it too, in small print)."""
    if not left_out:
        return None
    return (f"{command}: --plot draws the time rows of the first {MAX_TIME_ROWS} jobs; left out: {', '.join(left_out)} "
            "(analyze.py with them alone draws theirs).")


def plot_jobs(jobs: pa.Table, path: str | Path) -> list[str]:
    """Stacked mean latency per stage for each job, beside it throughput against p99 per config and load
    mode; under them, for each of the first MAX_TIME_ROWS jobs, throughput, CPU, memory and GPU over time.
    Returns the jobs whose rows over time were left out (the figure says which too).

    Mean stage times stack to the mean end-to-end latency exactly (the stages
    partition each item's time), which is why the bars use means.
    """
    import matplotlib  # here, not at the top: only plotting pays for the slow import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = jobs.to_pylist()
    curves = load_curves(jobs)
    timed = records[:MAX_TIME_ROWS]
    left_out = [job["job_id"] for job in records[MAX_TIME_ROWS:]]
    streamed = [job for job in records if job.get("streams_record")][:MAX_TIME_ROWS]
    extra = [3] if streamed else []
    figure = plt.figure(figsize=(13 if curves else 8, 5 + 3 * len(timed) + sum(extra)))
    grid = figure.add_gridspec(1 + len(timed) + len(extra), 6, height_ratios=[5] + [3] * len(timed) + extra)
    _stage_bars(figure.add_subplot(grid[0, :3] if curves else grid[0, :]), records)
    if curves:
        _load_curves(figure.add_subplot(grid[0, 3:]), curves)
    for row, job in enumerate(timed, start=1):
        _over_time([figure.add_subplot(grid[row, 2 * i: 2 * i + 2]) for i in range(3)], job)
    if streamed:
        _stream_lateness(figure.add_subplot(grid[-1, :]), streamed)
    if left_out:
        figure.suptitle(f"over time: the first {MAX_TIME_ROWS} jobs; left out: {', '.join(left_out)}", fontsize=8,
                        wrap=True)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return left_out
