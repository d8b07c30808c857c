"""The job page's plots (plotly): stages, offered and served rates, latency over time, missed frames, processes.

The same series as analyze.py --plot (rnb.analysis.series), drawn the
same way: legends under the plot, clear of the data; a rate's axis from 0;
a log axis labelled at 1, 2 and 5 of each decade; a stream axis in whole
streams.  Each function returns the figure's HTML (rnb.analysis.html.figure).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rnb.analysis.job_columns import stat_column
from rnb.analysis.report import MAX_LINEAR_SPREAD, TableRow
from rnb.analysis.series import JobSeries
from rnb.core.stages import PARTS, part_key

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Under the plot, in a row: never on the data.
LEGEND_UNDER: dict[str, Any] = {"orientation": "h", "yanchor": "top", "y": -0.3, "xanchor": "left", "x": 0.0}
MARGIN = {"l": 60, "r": 20, "t": 40, "b": 40}


def figure(fig: go.Figure, div_id: str) -> str:
    """A plotly figure as a <div> and the script that draws it (plotly.js itself is in the page's head)."""
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True}))


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2 and 5 times each power of ten from below `low` to above `high` (both > 0): a log axis's labels."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        ticks += [mantissa * 10.0 ** exponent for mantissa in (1, 2, 5)]
    inside = [tick for tick in ticks if low <= tick <= high]
    below = [tick for tick in ticks if tick < low][-1:]
    above = [tick for tick in ticks if tick > high][:1]
    return below + inside + above


def log_axis(low: float, high: float) -> dict[str, Any]:
    """A plotly log axis's settings whose labels read 1, 2, 5, 10, ... in plain numbers."""
    ticks = log_ticks(low, high)
    return {"type": "log", "tickvals": ticks, "ticktext": [f"{tick:g}" for tick in ticks]}


def stage_figure(job: TableRow, div_id: str, steps: list[str]) -> str:
    """Mean time of each part of each step (`steps` name them), stacked: they add up to the mean end-to-end latency.

    Where the parts span more than MAX_LINEAR_SPREAD (a sub-millisecond copy
    beside an 800 ms network), they stand side by side on a log axis
    instead, so each one shows.
    """
    import plotly.graph_objects as go

    means = {part.name: [job.get(stat_column(part_key(part, k), "mean")) or 0.0 for k in range(job["num_steps"])]
             for part in PARTS}
    means = {name: values for name, values in means.items() if any(values)}
    shown = [value for values in means.values() for value in values if value > 0]
    spread = bool(shown) and max(shown) > MAX_LINEAR_SPREAD * min(shown)
    fig = go.Figure()
    for name, values in means.items():
        fig.add_bar(name=name, x=values, y=steps, orientation="h")
    title = ("mean latency by step and stage (ms, log scale, side by side)" if spread
             else "mean latency by step and stage (ms)")
    axis = log_axis(min(shown), max(shown)) if spread else {"type": "linear"}
    fig.update_layout(barmode="group" if spread else "stack", title=title, legend=LEGEND_UNDER,
                      height=200 + (40 + 40 * spread) * job["num_steps"], xaxis={"title": "ms", **axis},
                      margin={**MARGIN, "l": 160}, yaxis={"autorange": "reversed"})
    return figure(fig, div_id)


def rates_figure(series: JobSeries, job: TableRow, div_id: str) -> str:
    """Requests offered and items served per second over the run, the load's own rate dashed, a steady stretch
    shaded (a schedule has none: its spans are in the table above)."""
    import plotly.graph_objects as go

    rates = series.rates()
    edges = [*rates.starts, rates.starts[-1] + rates.window_s] if rates.starts else []
    fig = go.Figure()
    for name, values in (("offered", rates.offered), ("served", rates.served)):
        fig.add_scatter(x=edges, y=[*values, *values[-1:]], line={"shape": "hv"}, name=name)
    if rates.scheduled is not None:
        fig.add_scatter(x=rates.scheduled.x, y=rates.scheduled.y, line={"dash": "dash", "color": "grey"},
                        name=rates.scheduled.name)
    if job.get("steady_start_s") is not None and not job.get("schedule_spans"):
        fig.add_vrect(x0=job["steady_start_s"], x1=job["steady_end_s"], fillcolor="green", opacity=0.15, line_width=0)
        fig.add_scatter(x=[None], y=[None], mode="markers", marker={"color": "rgba(0,128,0,0.3)", "symbol": "square"},
                        name="steady state")
    fig.update_layout(title=f"requests/s offered and served, over {rates.window_s:.2g} s windows", height=320,
                      xaxis_title="s after start", yaxis={"title": "requests/s", "rangemode": "tozero"},
                      legend=LEGEND_UNDER, margin=MARGIN)
    return figure(fig, div_id)


def latency_figure(series: JobSeries, div_id: str) -> str:
    """Each item's end-to-end latency at the time it was sent, and the rolling p99 over the items."""
    import plotly.graph_objects as go

    x, y = series.latency()
    rolling = series.rolling_p99(series.window_s())
    fig = go.Figure()
    fig.add_scatter(x=x.tolist(), y=y.tolist(), mode="markers", marker={"size": 3, "opacity": 0.4}, name="an item")
    fig.add_scatter(x=rolling.x, y=rolling.y, line={"color": "red"}, name=rolling.name)
    low, high = (float(y.min()), float(y.max())) if y.size else (1.0, 1.0)
    axis = log_axis(low, high) if low > 0 and high > MAX_LINEAR_SPREAD * low else {"rangemode": "tozero"}
    fig.update_layout(title="end-to-end latency (ms) by when each item was sent", height=320,
                      xaxis_title="s after start", yaxis={"title": "ms", **axis}, legend=LEGEND_UNDER, margin=MARGIN)
    return figure(fig, div_id)


def missed_figure(series: JobSeries, div_id: str) -> str | None:
    """Each stream's missed frames over the run, a share of those it offered in each window; None without streams."""
    import plotly.graph_objects as go

    missed = series.missed()
    if missed is None or not missed.starts:
        return None
    centres = [start + missed.window_s / 2 for start in missed.starts]
    streams = list(range(len(missed.percent)))
    fig = go.Figure(go.Heatmap(x=centres, y=streams, z=[list(row) for row in missed.percent], zmin=0, zmax=100,
                               colorscale="Reds", colorbar={"title": {"text": "% missed", "side": "right"}},
                               hovertemplate="stream %{y}, %{x:.3g} s: %{z:.1f}% missed<extra></extra>"))
    fig.update_layout(title="missed frames (late or dropped) by stream", height=200 + 14 * min(len(streams), 40),
                      xaxis_title="s after start", yaxis={"title": "stream", "tickformat": "d",
                                                          "dtick": max(1, math.ceil(len(streams) / 20))},
                      margin=MARGIN)
    return figure(fig, div_id)


def processes_figure(series: JobSeries, div_id: str) -> str | None:
    """Each process's CPU use and memory over the run (GPUs' utilisation and memory too); None without samples."""
    from plotly.subplots import make_subplots

    cpu, memory = series.cpu_and_memory()
    if not cpu and not memory:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("CPU % of one core (GPU util %)", "memory (MiB)"))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf"]
    for index, (use, held) in enumerate(zip(cpu, memory)):
        colour = palette[index % len(palette)]
        fig.add_scatter(x=use.x, y=use.y, name=use.name, legendgroup=use.name, line={"color": colour}, row=1, col=1)
        fig.add_scatter(x=held.x, y=held.y, name=held.name, legendgroup=use.name, showlegend=False,
                        line={"color": colour}, row=2, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(title_text="s after start", row=2, col=1)
    fig.update_layout(title="each process over the run", height=560, legend={**LEGEND_UNDER, "y": -0.15},
                      margin={**MARGIN, "t": 70})
    return figure(fig, div_id)
