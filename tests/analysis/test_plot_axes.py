"""Plots as a browser draws them: every axis spans its plot's data, on the job page and the tuner's log-scale plot.

Each page is opened in Debian's headless chromium (scripts/test.sh installs
it), and each plotly axis's drawn range is compared with the data of its
traces (tests.support.tune_support.axis_misfits): a range that leaves data out, or
dwarfs it so that the data lie on one flat line, fails.
"""
from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from rnb.analysis.figures import figure, stage_figure
from rnb.analysis.html import page
from rnb.tune.pareto import Point, pareto_figure
from tests.support.handmade_job import run_analyze
from tests.support.tune_support import render

PREDICTED = [Point("1 | b8 | 1 | 1", 120.0, 35.0), Point("2 | b8 | 1 | 1", 230.0, 60.0), Point("3 | b8 | 1 | 1", 250.0, 900.0)]
MEASURED = {"2 | b8 | 1 | 1": [Point("8", 125.0, 22.0), Point("4.5", 221.0, 140.0), Point("4", 248.0, 2600.0)]}


def test_the_job_page_draws_its_plots_with_axes_that_span_their_data(handmade: Path, tmp_path: Path) -> None:
    out = tmp_path / "job.html"
    done = run_analyze(str(handmade), "--html", str(out), "--min-items", "1", "--min-duration", "0")
    assert done.returncode == 0, done.stderr
    seen = render(out)
    # stages, rates, latency: the hand-made job has no samples and no streams
    assert seen.errors == () and seen.fetched == () and seen.plots == 3
    assert seen.misfit_axes == () and seen.overlaps == () and seen.legends_on_data == ()
    text = out.read_text()
    body = text[text.index("</head>"):]
    # The title names the job once; the stage table names each step's model.
    assert body.count("handmade") == 1 and "<h1>RnB job handmade</h1>" in body
    assert "<td>step 0 (Loader)</td>" in body and "<td>step 1 (Net)</td>" in body


def test_stages_a_hundredfold_apart_stand_side_by_side_on_a_log_axis(tmp_path: Path) -> None:
    """A sub-millisecond copy beside an 800 ms network: stacked on a linear axis, the copy would not show."""
    row = {"num_steps": 2, "step_models": '["models.toy.SyntheticFrames", "models.r2p1d.R2P1DRunner"]',
           "copy0_mean_ms": 0.3, "inside0_mean_ms": 2.0, "copy1_mean_ms": 0.4, "inside1_mean_ms": 800.0}
    out = tmp_path / "stages.html"
    steps = ["step 0 (SyntheticFrames)", "step 1 (R2P1DRunner)"]
    out.write_text(page("stages", [stage_figure(row, "stages", steps)]), encoding="utf-8")
    text = out.read_text()
    assert '"barmode":"group"' in text and '"type":"log"' in text and "step 1 (R2P1DRunner)" in text
    seen = render(out)
    assert seen.errors == () and seen.plots == 1 and seen.misfit_axes == ()
    row.update(copy0_mean_ms=30.0, inside0_mean_ms=200.0, copy1_mean_ms=40.0)   # within a hundredfold: stacked
    assert '"barmode":"stack"' in stage_figure(row, "stages", steps)


def test_the_tuners_log_scale_plot_spans_its_points_and_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "pareto.html"
    fig = pareto_figure(PREDICTED, MEASURED, MEASURED["2 | b8 | 1 | 1"][1], 200.0, 99.0)
    out.write_text(page("pareto", [figure(fig, "pareto")]), encoding="utf-8")
    seen = render(out)
    assert seen.errors == () and seen.plots == 1 and seen.misfit_axes == ()
    assert "bound 200 ms" in out.read_text()


def test_the_axis_check_catches_an_annotation_that_stretches_a_log_axis(tmp_path: Path) -> None:
    """The plot as it was: add_hline's annotation placed at 10^200 ms, every point on one flat line."""
    out = tmp_path / "stretched.html"
    fig = go.Figure(go.Scatter(x=[p.throughput for p in PREDICTED], y=[p.latency_ms for p in PREDICTED]))
    fig.add_hline(y=200.0, annotation_text="bound 200 ms")
    fig.update_layout(yaxis_type="log")
    out.write_text(page("stretched", [figure(fig, "stretched")]), encoding="utf-8")
    (misfit,) = render(out).misfit_axes
    assert misfit.startswith("stretched yaxis (log): range ") and misfit.endswith(", data 1.544 to 2.954")
