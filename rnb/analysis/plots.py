"""analyze.py --plot and sweep.py --plot: one PNG of the jobs, as readable at 1 job as at 30.

The top row holds each job's mean stage latencies and, where one config ran
at several loads, throughput against p99.  Then a row over the run of each
of the first MAX_TIME_ROWS jobs: requests offered and served per second
(the load's own rate drawn), each item's latency with a rolling p99, each
process's CPU and memory, and for camera streams each stream's missed
frames.  Camera-stream jobs end with their late and dropped frames per
stream.  Beyond one job, jobs are labelled J1, J2, ... and a key under the
figure names them; legends stand beside or under their axes, never on the
data; a rate's axis starts at 0; a log axis is labelled 1, 2, 5 per decade.
The series are rnb.analysis.series's, which the job page draws too.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from rnb.analysis.job_columns import stat_column
from rnb.analysis.report import MAX_LINEAR_SPREAD, Colour, LoadPoint, TableRow, load_curves
from rnb.analysis.series import JobSeries
from rnb.analysis.streams import per_stream_missed
from rnb.core.stages import PARTS, part_key

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn: only plotting pays for the slow import
    from matplotlib.axes import Axes
    from matplotlib.axis import XAxis, YAxis
    from matplotlib.figure import Figure

MAX_TIME_ROWS = 6   # jobs drawn over time; more would make the figure a poster
KEY_LINES = 10      # lines per column of the key of job labels
SMALL = 7           # the font size of ticks, legends and panel titles


def job_labels(records: Sequence[TableRow]) -> list[str]:
    """Each job's label on the plot: its id when it is alone, else J1, J2, ... (the key names them)."""
    return [str(records[0]["job_id"])] if len(records) == 1 else [f"J{i}" for i in range(1, len(records) + 1)]


def stage_colours(num_steps: int) -> list[Colour]:
    """One distinct colour per (step, stage part), in stacking order."""
    import matplotlib

    count = num_steps * len(PARTS)
    if count <= 20:
        return [matplotlib.colormaps["tab20"](index) for index in range(count)]
    return [matplotlib.colormaps["turbo"](index / (count - 1)) for index in range(count)]


def readable_log(axis: Axes, which: str = "y") -> None:
    """A log axis labelled at 1, 2 and 5 of each decade in plain numbers, no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    scale = axis.yaxis if which == "y" else axis.xaxis
    scale.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    scale.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    scale.set_minor_formatter(NullFormatter())


def _legend_beside(axis: Axes) -> None:
    """The legend to the right of the axes, clear of the data."""
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _legend_under(axis: Axes, columns: int = 2) -> None:
    """The legend under the axes (a small panel has no room beside it), clear of the data; the axes' x is seconds
    after the job's start."""
    axis.set_xlabel("s after start", fontsize=SMALL)
    axis.tick_params(labelsize=SMALL)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=SMALL - 1, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=columns,
                    borderaxespad=0.0, frameon=False)


def _stage_bars(axis: Axes, records: list[TableRow], labels: list[str]) -> None:
    """Each job's mean stage times, stacked; side by side on a log axis where they span more than MAX_LINEAR_SPREAD."""
    steps = max(r["num_steps"] for r in records)
    named = [(f"step {k} {part.name}", [r.get(stat_column(part_key(part, k), "mean")) or 0.0 for r in records])
             for k in range(steps) for part in PARTS]
    series = [(label, heights, colour) for (label, heights), colour in zip(named, stage_colours(steps)) if any(heights)]
    shown = [height for _, heights, _ in series for height in heights if height > 0]
    side_by_side = bool(shown) and max(shown) > MAX_LINEAR_SPREAD * min(shown)
    positions = list(range(len(records)))
    width = 0.8 / max(len(series), 1)
    bottoms = [0.0] * len(records)
    for index, (label, heights, colour) in enumerate(series):
        if side_by_side:
            axis.bar([p - 0.4 + (index + 0.5) * width for p in positions], heights, width=width, label=label, color=colour)
        else:
            axis.bar(positions, heights, bottom=bottoms, label=label, color=colour)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    if side_by_side:
        axis.set_yscale("log")
        readable_log(axis)
    axis.set_ylabel("mean latency (ms, log scale)" if side_by_side else "mean latency (ms)")
    axis.set_title("latency by stage, side by side" if side_by_side else "end-to-end latency by stage", fontsize=9)
    axis.set_xticks(positions, labels, fontsize=SMALL)
    _legend_beside(axis)


def _load_curves(axis: Axes, curves: dict[str, list[LoadPoint]]) -> None:
    """Throughput against p99 per config and load mode; each point named by its load where the points are few."""
    invalid = False
    for config, points in curves.items():
        axis.plot([p.throughput for p in points], [p.p99_ms for p in points], marker="o", label=config)
        for point in points if len(points) <= 8 else ():
            axis.annotate(point.label if point.valid else f"{point.label} INVALID", (point.throughput, point.p99_ms),
                          fontsize=SMALL - 1, xytext=(3, 3), textcoords="offset points")
        wrong = [p for p in points if not p.valid]
        if wrong:   # a hollow red ring around each: its p99 is a guess (analyze's table says why)
            axis.scatter([p.throughput for p in wrong], [p.p99_ms for p in wrong], s=140, facecolors="none",
                         edgecolors="red", zorder=3, label=None if invalid else "INVALID job")
            invalid = True
    axis.set_xlim(left=0)
    axis.set_xlabel("throughput (items/s)")
    axis.set_ylabel("p99 end-to-end latency (ms)")
    axis.set_title("throughput against p99 latency", fontsize=9)
    _legend_beside(axis)


def _rates(axis: Axes, series: JobSeries, job: TableRow, label: str) -> None:
    """Requests offered and items served per second over the run, the load's own rate dashed, a steady stretch
    shaded (a schedule has none: its spans are in the report)."""
    rates = series.rates()
    edges = [*rates.starts, rates.starts[-1] + rates.window_s] if rates.starts else []
    if edges:
        axis.step(edges, [*rates.offered, rates.offered[-1]], where="post", label="offered")
        axis.step(edges, [*rates.served, rates.served[-1]], where="post", label="served")
    if rates.scheduled is not None:
        axis.plot(rates.scheduled.x, rates.scheduled.y, linestyle="--", color="grey", label=rates.scheduled.name)
    if job.get("steady_start_s") is not None and not job.get("schedule_spans"):
        axis.axvspan(job["steady_start_s"], job["steady_end_s"], alpha=0.15, color="green", label="steady state")
    axis.set_ylim(bottom=0)
    axis.set_title(f"{label}: requests/s over {rates.window_s:.2g} s windows", fontsize=SMALL)
    _legend_under(axis)


def _latency(axis: Axes, series: JobSeries) -> None:
    """Each item's end-to-end latency at its enqueue time, and the rolling p99 over it."""
    x, y = series.latency()
    if x.size:
        axis.scatter(x, y, s=2, alpha=0.3, color="tab:blue", label="an item")
        rolling = series.rolling_p99(series.window_s())
        axis.plot(rolling.x, rolling.y, color="tab:red", label=rolling.name)
        if y.min() > 0 and y.max() > MAX_LINEAR_SPREAD * y.min():
            axis.set_yscale("log")
            readable_log(axis)
        else:
            axis.set_ylim(bottom=0)
    axis.set_title("latency (ms) by when sent", fontsize=SMALL)
    _legend_under(axis)


def _processes(cpu: Axes, memory: Axes, series: JobSeries) -> None:
    """Each process's CPU use and memory over the run, in one colour per process in both."""
    cpu_lines, memory_lines = series.cpu_and_memory()
    for line in cpu_lines:
        cpu.plot(line.x, line.y, label=line.name)
    for line in memory_lines:
        memory.plot(line.x, line.y)
    cpu.set_ylim(bottom=0)
    memory.set_ylim(bottom=0)
    cpu.set_title("CPU % (of one core), GPU util %", fontsize=SMALL)
    memory.set_title("memory (MiB), colours as CPU's", fontsize=SMALL)
    _legend_under(cpu, columns=3)
    _legend_under(memory)


def _missed(axis: Axes, series: JobSeries) -> None:
    """Each stream's missed frames over the run, as a share of those it offered in each window."""
    missed = series.missed()
    if missed is None or not missed.starts:
        axis.set_axis_off()
        return
    edges = [*missed.starts, missed.starts[-1] + missed.window_s]
    mesh = axis.pcolormesh(edges, [s - 0.5 for s in range(len(missed.percent) + 1)], missed.percent, cmap="Reds",
                           vmin=0, vmax=100)
    axis.figure.colorbar(mesh, ax=axis, label="% missed")
    _whole_streams(axis.yaxis, len(missed.percent))
    axis.set_ylabel("stream", fontsize=SMALL)
    axis.set_title("missed frames by stream", fontsize=SMALL)
    _legend_under(axis)


def _whole_streams(scale: XAxis | YAxis, streams: int) -> None:
    """A stream axis labelled at whole streams: each one where they are few, else as many whole ones as fit."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    scale.set_major_locator(FixedLocator(list(range(streams))) if streams <= 16 else MaxNLocator(integer=True))


def _stream_lateness(axis: Axes, jobs: list[TableRow], labels: list[str]) -> None:
    """Per stream of each camera-stream job: the share of its frames late, and above it the share dropped."""
    width = 0.8 / len(jobs)
    for index, (job, label) in enumerate(zip(jobs, labels)):
        fractions = per_stream_missed(json.loads(job["streams_record"]))
        xs = [stream - 0.4 + (index + 0.5) * width for stream in range(len(fractions))]
        late = [100 * late for late, _ in fractions]
        axis.bar(xs, late, width, label=f"{label} late")
        axis.bar(xs, [100 * dropped for _, dropped in fractions], width, bottom=late, hatch="//", alpha=0.5,
                 label=f"{label} dropped")
    _whole_streams(axis.xaxis, max(len(per_stream_missed(json.loads(job["streams_record"]))) for job in jobs))
    axis.set_xlabel("stream")
    axis.set_ylabel("% of frames offered")
    axis.set_title("late and dropped frames per stream", fontsize=9)
    _legend_beside(axis)


def _key(axis: Axes, records: list[TableRow], labels: list[str], left_out: list[str]) -> None:
    """The jobs' labels and ids, in columns of KEY_LINES, and which jobs have no row over time."""
    axis.set_axis_off()
    lines = [f"{label}  {job['job_id']}" for label, job in zip(labels, records)]
    columns = math.ceil(len(lines) / KEY_LINES)
    for column in range(columns):
        axis.text(column / columns, 1.0, "\n".join(lines[column * KEY_LINES:(column + 1) * KEY_LINES]),
                  va="top", ha="left", fontsize=SMALL, family="monospace", transform=axis.transAxes)
    if left_out:
        axis.text(0.0, 0.0, f"over time: {labels[0]} to {labels[MAX_TIME_ROWS - 1]}; left out: "
                            f"{labels[MAX_TIME_ROWS]} to {labels[-1]}", fontsize=SMALL, transform=axis.transAxes)


def jobs_figure(jobs: pa.Table) -> tuple[Figure, list[str]]:
    """The whole figure, and the jobs whose rows over time were left out (by id)."""
    import matplotlib  # here, not at the top: only plotting pays for the slow import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = jobs.to_pylist()
    labels = job_labels(records)
    curves = load_curves(jobs)
    timed = records[:MAX_TIME_ROWS]
    left_out = [str(job["job_id"]) for job in records[MAX_TIME_ROWS:]]
    streamed = [(job, label) for job, label in zip(records, labels) if job.get("streams_record")][:MAX_TIME_ROWS]
    columns = 5 if any(job.get("streams_record") for job in timed) else 4
    heights = [5.0] + [3.2] * len(timed) + ([3.0] if streamed else []) + ([0.3 + 0.16 * min(len(records), KEY_LINES)]
                                                                            if len(records) > 1 else [])
    figure = plt.figure(figsize=(4.2 * columns, sum(heights) + 0.5), layout="constrained")
    grid = figure.add_gridspec(len(heights), 2 * columns, height_ratios=heights)
    split = columns if curves else 2 * columns
    _stage_bars(figure.add_subplot(grid[0, :split]), records, labels)
    if curves:
        _load_curves(figure.add_subplot(grid[0, split:]), curves)
    for row, (job, label) in enumerate(zip(timed, labels), start=1):
        series = JobSeries(job)
        panels = [figure.add_subplot(grid[row, 2 * i: 2 * i + 2]) for i in range(columns)]
        _rates(panels[0], series, job, label)
        _latency(panels[1], series)
        _processes(panels[2], panels[3], series)
        if columns == 5:
            _missed(panels[4], series)
    if streamed:
        _stream_lateness(figure.add_subplot(grid[1 + len(timed), :]), [job for job, _ in streamed],
                         [label for _, label in streamed])
    if len(records) > 1:
        _key(figure.add_subplot(grid[-1, :]), records, labels, left_out)
    return figure, left_out


def plot_jobs(jobs: pa.Table, path: str | Path) -> list[str]:
    """The figure written as a PNG; the jobs whose rows over time were left out (the figure's key says so too)."""
    import matplotlib.pyplot as plt

    figure, left_out = jobs_figure(jobs)
    figure.savefig(path, format="png")
    plt.close(figure)
    return left_out


def left_out_sentence(command: str, left_out: list[str]) -> str | None:
    """What a --plot that left jobs' time rows out says on stderr (the figure's key says it too)."""
    if not left_out:
        return None
    return (f"{command}: --plot draws the time rows of the first {MAX_TIME_ROWS} jobs; left out: {', '.join(left_out)} "
            "(analyze.py with them alone draws theirs).")
