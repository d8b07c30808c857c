"""The tuner's throughput-against-latency plot: predicted peaks, their Pareto frontier, the finalists' trials."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rnb.analysis.sweep import format_interval
from rnb.tune.search import Search
from rnb.tune.space import TuneSpace
from rnb.tune.verify import Verified

if TYPE_CHECKING:
    import plotly.graph_objects as go


@dataclass(frozen=True)
class Point:
    label: str
    throughput: float
    latency_ms: float


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other beats on both counts (more throughput and less latency), by throughput."""
    frontier: list[Point] = []
    for point in sorted(points, key=lambda p: (-p.throughput, p.latency_ms)):
        if not frontier or point.latency_ms < frontier[-1].latency_ms:
            frontier.append(point)
    return sorted(frontier, key=lambda p: p.throughput)


def plot_points(space: TuneSpace, found: Search, verified: Sequence[Verified]) -> tuple[list[Point], dict[str, list[Point]]]:
    """Each predicted candidate at its predicted peak; each finalist's measured trials."""
    q = found.estimator.percentile
    predicted = [Point(space.short_label(e.candidate), e.estimate.at_peak.throughput_items_per_s,
                       e.estimate.at_peak.latency_ms[q])
                 for e in found.ranked() if e.estimate.at_peak is not None]
    measured = {space.short_label(v.candidate): [Point(format_interval(t.mean_interval_ms), t.rate_per_s, t.latency_ms)
                                                 for t in v.trials if math.isfinite(t.latency_ms)]
                for v in verified}
    return predicted, measured


def pareto_figure(predicted: Sequence[Point], measured: Mapping[str, Sequence[Point]], winner: Point | None,
                  bound_ms: float, q: float) -> go.Figure:
    """Throughput against the percentile (log scale): predicted peaks, their Pareto frontier, trials, the bound."""
    import plotly.graph_objects as go

    front = pareto(predicted)
    fig = go.Figure()
    fig.add_scatter(x=[p.throughput for p in predicted], y=[p.latency_ms for p in predicted], mode="markers",
                    name="predicted, at each candidate's predicted peak", text=[p.label for p in predicted],
                    marker={"color": "#999", "size": 7})
    fig.add_scatter(x=[p.throughput for p in front], y=[p.latency_ms for p in front], mode="lines+markers",
                    name="Pareto frontier (predicted)", text=[p.label for p in front], line={"shape": "hv"})
    for label, points in measured.items():
        fig.add_scatter(x=[p.throughput for p in points], y=[p.latency_ms for p in points], mode="lines+markers",
                        name=f"measured: {label}", text=[f"-mi {p.label}" for p in points])
    if winner is not None:
        fig.add_scatter(x=[winner.throughput], y=[winner.latency_ms], mode="markers", name="winner (measured)",
                        marker={"symbol": "star", "size": 16, "color": "gold", "line": {"width": 1, "color": "black"}})
    # A line's shape takes its y as data on a log axis, an annotation the log10 of it (plotly.js#1258): one
    # annotation_text on add_hline would be placed at 10^bound ms and stretch the axis up to there.
    fig.add_hline(y=bound_ms, line_dash="dash")
    fig.add_annotation(x=1, xref="paper", y=math.log10(bound_ms), yref="y", text=f"bound {bound_ms:g} ms",
                       showarrow=False, xanchor="right", yanchor="bottom")
    fig.update_layout(title=f"throughput against p{q:g} latency", xaxis_title="items/s (request rate)",
                      yaxis_title=f"p{q:g} end-to-end latency (ms, log scale)", yaxis_type="log", height=460)
    return fig


def write_plot_png(path: Path, space: TuneSpace, found: Search, verified: Sequence[Verified],
                   winner: Verified | None, bound_ms: float) -> None:
    """The same plot as a PNG beside the page, for slides and documents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = found.estimator.percentile
    predicted, measured = plot_points(space, found, verified)
    front = pareto(predicted)
    fig, axis = plt.subplots(figsize=(8, 5))
    axis.scatter([p.throughput for p in predicted], [p.latency_ms for p in predicted], color="#999", s=14,
                 label="predicted peak of each candidate")
    axis.step([p.throughput for p in front], [p.latency_ms for p in front], where="post", label="Pareto frontier (predicted)")
    for label, points in measured.items():
        axis.plot([p.throughput for p in points], [p.latency_ms for p in points], marker="o", label=f"measured: {label}")
    if winner is not None and winner.best is not None:
        axis.scatter([winner.best.rate_per_s], [winner.best.latency_ms], marker="*", s=200, color="gold",
                     edgecolors="black", zorder=5, label="winner (measured)")
    axis.axhline(bound_ms, linestyle="--", color="red", linewidth=1, label=f"bound {bound_ms:g} ms")
    axis.set_xlabel("items/s (request rate)")
    axis.set_yscale("log")   # a rate past the peak measures seconds, the ones under the bound tens of ms
    axis.set_ylabel(f"p{q:g} end-to-end latency (ms, log scale)")
    axis.set_title(f"throughput against p{q:g} latency")
    axis.legend(fontsize=7)
    fig.tight_layout()
    partial = path.with_name(path.name + ".partial.png")
    fig.savefig(partial, format="png")
    plt.close(fig)
    os.replace(partial, path)
