"""rnb-tune --objective streams's report: the files the latency objective writes, for streams.

DIR/streams.json (every finalist, predicted and measured), candidates.parquet
(every candidate with its predicted streams, and what each finalist measured
and what bounds it), streams.png (predicted against measured streams),
report.html (all of it on one self-contained page, each finalist's job
with the analysis page's plots) and, when a finalist sustained a stream,
best.json.  Each file is written whole or not at all.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rnb.analysis.figures import figure
from rnb.analysis.html import job_section, page, paragraph, table
from rnb.analysis.jobs import ValidityRules, load_jobs, rows_to_table
from rnb.analysis.stream_search import StreamTrial, bound_sentence, counted
from rnb.core.records import JsonObject
from rnb.tune.profile import Profile
from rnb.tune.profile_cache import write_json_atomic
from rnb.tune.report import BEST, CANDIDATES, REPORT, profile_row, write_parquet_atomic
from rnb.tune.space import TuneSpace
from rnb.tune.streams import STREAMS_REPORT, MeasuredStreams, StreamFinalist, StreamGoal

if TYPE_CHECKING:
    import plotly.graph_objects as go

STREAMS_PLOT = "streams.png"
CLOSE = 0.15   # a prediction within one stream or this share of the measured is as good as the search can tell


@dataclass(frozen=True)
class StreamOutcome:
    """What the streams objective asked, predicted and measured."""

    config: str
    budget: str
    goal: StreamGoal
    search: str                              # the search mode
    engine: str
    ranked: tuple[StreamFinalist, ...]       # every candidate predicted, most streams first, then fewer devices
    measured: tuple[MeasuredStreams, ...]    # the finalists, in rank order
    profiles: tuple[tuple[str, Profile], ...]
    seconds: Mapping[str, float]             # phase -> wall seconds

    @property
    def winner(self) -> MeasuredStreams | None:
        """The finalist that sustained the most streams as measured (the fewer devices among equals); None when
        none sustained one."""
        best = max(self.measured, key=lambda m: (m.search.best, -m.finalist.devices), default=None)
        return best if best is not None and best.search.best > 0 else None


def close_enough(predicted: int, measured: int) -> bool:
    """Whether a prediction is within one stream, or CLOSE of the measured."""
    return abs(predicted - measured) <= max(1.0, CLOSE * measured)


def candidate_rows(space: TuneSpace, outcome: StreamOutcome) -> list[JsonObject]:
    """One row per candidate predicted: its settings and predicted streams, and for a finalist what it measured."""
    by_key = {m.finalist.candidate.key: m for m in outcome.measured}
    rows: list[JsonObject] = []
    for rank, finalist in enumerate(outcome.ranked, start=1):
        candidate = finalist.candidate
        row: JsonObject = {"key": candidate.key, "rank": rank, "label": space.label(candidate),
                           "short_label": space.short_label(candidate), "devices_used": finalist.devices,
                           "predicted_streams": finalist.predicted, "verified": candidate.key in by_key}
        measured = by_key.get(candidate.key)
        if measured is not None:
            best = _trial_at(measured, measured.search.best)
            row.update({"measured_streams": measured.search.best, "failed_at": measured.search.above,
                        "bound": bound_sentence(measured.search), "config_path": str(measured.config_path),
                        "job_log": None if best is None else str(best.job_dir),
                        "prediction_close": close_enough(finalist.predicted, measured.search.best)})
        rows.append(row)
    return rows


def _trial_at(measured: MeasuredStreams, streams: int) -> StreamTrial | None:
    return next((trial for trial in measured.search.trials if trial.streams == streams), None)


def streams_document(space: TuneSpace, outcome: StreamOutcome) -> JsonObject:
    """DIR/streams.json: the goal, every finalist's prediction, measurement, bound and trials, and the answer."""
    goal, winner = outcome.goal, outcome.winner
    return {
        "fps": goal.fps, "bound": goal.bound, "deadline_ms": goal.deadline_ms,
        "finalists": [{"candidate": space.label(m.finalist.candidate), "config": str(m.config_path),
                       "predicted_streams": m.finalist.predicted, "streams": m.search.best, "failed_at": m.search.above,
                       "what_bounds_it": bound_sentence(m.search),
                       "trials": [{"streams": t.streams, "missed_fraction": t.missed_fraction,
                                   "latency_ms": None if math.isinf(t.latency_ms) else t.latency_ms,
                                   "bound": None if t.bound is None else t.bound.trial_words(),
                                   "job_dir": str(t.job_dir), "job_dirs": [str(job) for job in t.job_dirs]}
                                  for t in m.search.trials]} for m in outcome.measured],
        "streams": winner.search.best if winner is not None else 0,
        "what_bounds_it": bound_sentence(winner.search) if winner is not None else None}


def predicted_figure(outcome: StreamOutcome, space: TuneSpace) -> go.Figure:
    """Each finalist's measured streams against its predicted, the line where they agree, and the band the
    prediction should keep to (one stream or CLOSE)."""
    import plotly.graph_objects as go

    top = max([1, *(m.finalist.predicted for m in outcome.measured), *(m.search.best for m in outcome.measured)]) + 1
    line = list(range(top + 1))
    fig = go.Figure()
    fig.add_scatter(x=line, y=[max(0.0, x - max(1.0, CLOSE * x)) for x in line], mode="lines", line={"width": 0},
                    showlegend=False, hoverinfo="skip")
    fig.add_scatter(x=line, y=[min(top + 0.5, x + max(1.0, CLOSE * x)) for x in line], mode="lines", line={"width": 0},
                    fill="tonexty", fillcolor="rgba(0,128,0,0.12)", name="within one stream or 15%", hoverinfo="skip")
    fig.add_scatter(x=line, y=line, mode="lines", line={"dash": "dash", "color": "grey"}, name="measured = predicted")
    for index, measured in enumerate(outcome.measured, start=1):
        fig.add_scatter(x=[measured.finalist.predicted], y=[measured.search.best], mode="markers",
                        marker={"size": 11}, name=f"finalist {index}: {space.label(measured.finalist.candidate)}")
    fig.update_layout(title=f"streams at {outcome.goal.fps:g} fps: measured against predicted", height=420,
                      xaxis={"title": "predicted streams", "dtick": 1, "range": [-0.5, top + 0.5]},
                      yaxis={"title": "measured streams", "dtick": 1, "range": [-0.5, top + 0.5]},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0.0})
    return fig


def write_plot_png(path: Path, outcome: StreamOutcome, space: TuneSpace) -> None:
    """The same plot as a PNG beside the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    top = max([1, *(m.finalist.predicted for m in outcome.measured), *(m.search.best for m in outcome.measured)]) + 1
    line = list(range(top + 1))
    fig, axis = plt.subplots(figsize=(7, 5), layout="constrained")
    axis.fill_between(line, [max(0.0, x - max(1.0, CLOSE * x)) for x in line], [x + max(1.0, CLOSE * x) for x in line],
                      color="green", alpha=0.12, label="within one stream or 15%")
    axis.plot(line, line, linestyle="--", color="grey", label="measured = predicted")
    for index, measured in enumerate(outcome.measured, start=1):
        axis.scatter([measured.finalist.predicted], [measured.search.best], s=60, zorder=3,
                     label=f"finalist {index}: {space.label(measured.finalist.candidate)}")
    for scale in (axis.xaxis, axis.yaxis):
        scale.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlim(-0.5, top + 0.5)
    axis.set_ylim(-0.5, top + 0.5)
    axis.set_xlabel("predicted streams")
    axis.set_ylabel("measured streams")
    axis.set_title(f"streams at {outcome.goal.fps:g} fps: measured against predicted")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    partial = path.with_name(path.name + ".partial.png")
    fig.savefig(partial, format="png")
    plt.close(fig)
    os.replace(partial, path)


def report_page(space: TuneSpace, outcome: StreamOutcome, rows: Sequence[JsonObject], rules: ValidityRules) -> str:
    """report.html: what was asked, the answer and what bounds it, the plot, the candidates, each finalist's trials
    and job, and the profiles."""
    goal, winner = outcome.goal, outcome.winner
    body = [paragraph(f"config {outcome.config}; budget {outcome.budget}; objective streams at {goal.fps:g} fps, at "
                      f"most {goal.bound:.1%} of frames missed past a {goal.deadline_ms:g} ms deadline (policy "
                      f"{goal.policy}); search {outcome.search}; engine {outcome.engine}."),
            paragraph(f"{len(outcome.ranked)} candidates predicted, {len(outcome.measured)} measured; " + ", ".join(
                f"{phase} {seconds:.0f} s" for phase, seconds in outcome.seconds.items()) + ".", "note")]
    if winner is not None:
        body.append(paragraph(f"Best, as measured: {space.label(winner.finalist.candidate)}: "
                              f"{counted(winner.search.best)} at {goal.fps:g} fps (best.json runs it as is).", "bounds"))
        body.append(paragraph(bound_sentence(winner.search), "bounds"))
    else:
        body.append(paragraph(f"No finalist sustained one stream at {goal.fps:g} fps as measured; no best.json was "
                              "written.", "bounds"))
    body += ["<h2>Predicted against measured streams</h2>", figure(predicted_figure(outcome, space), "streams"),
             "<h2>Candidates</h2>"]
    columns = (("rank", "rank"), ("settings", "short_label"), ("devices", "devices_used"),
               ("predicted streams", "predicted_streams"), ("measured streams", "measured_streams"),
               ("and not", "failed_at"))
    best = next((i for i, row in enumerate(rows) if winner is not None and row["key"] == winner.finalist.candidate.key),
                None)
    body.append(table([title for title, _ in columns],
                      [["-" if row.get(key) is None else str(row.get(key)) for _, key in columns] for row in rows], best))
    body.append("<h2>Finalists, as measured</h2>")
    for index, measured in enumerate(outcome.measured, start=1):
        body += _finalist(space, measured, index, rules)
    body.append("<h2>Profiles</h2>")
    body.append(table(["profiled", "model", "calls", "mean ms", "p50 ms", "p99 ms", "held mean ms", "CPU ms per call",
                       "CPU fraction", "others' cores", "job"], [profile_row(what, p) for what, p in outcome.profiles]))
    return page(f"rnb-tune streams: {Path(outcome.config).name}", body)


def _finalist(space: TuneSpace, measured: MeasuredStreams, index: int, rules: ValidityRules) -> list[str]:
    """A finalist's trials, each with its bound, what bounds its answer, and its job at the most streams it
    sustained (else at its first trial)."""
    search = measured.search
    parts = [f"<h3>finalist {index}: {space.label(measured.finalist.candidate)}</h3>",
             paragraph(f"predicted {counted(measured.finalist.predicted)}; measured {counted(search.best)}"
                       + (f" (and not {search.above})" if search.above is not None else "")),
             table(["streams", "missed", "p99 ms", "busiest step", "jobs"],
                   [[str(t.streams), f"{t.missed_fraction:.1%}",
                     "target not reached" if math.isinf(t.latency_ms) else f"{t.latency_ms:.3g}",
                     "-" if t.bound is None else t.bound.trial_words(),
                     ", ".join(job.name for job in t.job_dirs)] for t in search.trials]),
             paragraph(bound_sentence(search), "bounds")]
    shown = _trial_at(measured, search.best) or (search.trials[0] if search.trials else None)
    if shown is not None:
        job = load_jobs([shown.job_dir], rules=rules).jobs.to_pylist()[0]
        parts += job_section(job, f"its job at {counted(shown.streams)}: {job['job_id']}", f"finalist-{index}")
    return parts


def write_streams_report(out: Path, space: TuneSpace, outcome: StreamOutcome, rules: ValidityRules) -> str:
    """Every file of the report (best.json last, only with a winner); the summary printed, one line per finalist,
    then the best and what bounds it."""
    rows = candidate_rows(space, outcome)
    write_json_atomic(out / STREAMS_REPORT, streams_document(space, outcome))
    write_parquet_atomic(out / CANDIDATES, rows_to_table(rows))
    write_plot_png(out / STREAMS_PLOT, outcome, space)
    partial = out / (REPORT + ".partial")
    partial.write_text(report_page(space, outcome, rows, rules), encoding="utf-8")
    os.replace(partial, out / REPORT)
    lines = [f"finalist {i}: {space.short_label(m.finalist.candidate)}  predicted {m.finalist.predicted} streams; "
             f"measured {m.search.best}" + (f" (and not {m.search.above})" if m.search.above is not None else "")
             for i, m in enumerate(outcome.measured, start=1)]
    winner, goal = outcome.winner, outcome.goal
    written = [out / STREAMS_REPORT, out / CANDIDATES, out / STREAMS_PLOT, out / REPORT]
    if winner is not None:
        run = {"streams": winner.search.best, "fps": goal.fps, "deadline_ms": goal.deadline_ms}
        write_json_atomic(out / BEST, space.document_for(
            winner.finalist.candidate, run=run, description=f"rnb-tune best for streams at {goal.fps:g} fps: "
                                                            f"{space.label(winner.finalist.candidate)}"))
        lines.append(f"best: {space.label(winner.finalist.candidate)}: {counted(winner.search.best)} at {goal.fps:g} fps")
        lines.append(bound_sentence(winner.search))
        written.insert(0, out / BEST)
    lines.append("wrote " + ", ".join(str(path) for path in written))
    return "\n".join(lines)
