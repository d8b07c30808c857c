"""The plots a user would rather look at than read: --plot's PNG at 1 job and at 30, and the job page in a browser.

Each check is one promise of issue 44's list: no text over text, integer
stream axes, legends clear of the data, rates over at least one sampling
interval and drawn from 0, log axes labelled 1, 2, 5 per decade, latency
over time with a rolling p99, offered against served rate with the load's
own rate drawn, missed frames over time per stream, and a schedule's spans
with each one's served rate and p99 in place of a steady state.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from rnb import cli
from rnb.analysis.html import write_job_page
from rnb.analysis.jobs import ValidityRules, load_jobs
from rnb.analysis.plots import jobs_figure
from tests.support.tune_support import render

matplotlib.use("Agg")
LENIENT = ValidityRules(min_duration_s=0, min_items=1)
SCHEDULE = "100@0.5s,300@0.25s"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real jobs: 2 camera streams at 30 fps into a 20 ms step under drop (60 frames/s offered, 50 served),
    1 stream into it, and a rate schedule on the toy pipeline."""
    logs = tmp_path_factory.mktemp("plots")
    runs = {"streams": ["-c", "config/streams-example.json", "--streams", "2", "--stream-policy", "drop", "-v", "150"],
            "one stream": ["-c", "config/streams-example.json", "--streams", "1", "-v", "60"],
            "schedule": ["-c", "config/toy.json", "--rate-schedule", SCHEDULE, "-v", "240"]}
    made = {}
    for name, argv in runs.items():
        assert cli.main([*argv, "--warmup", "0", "-q", "--log-dir", str(logs / name)]) == 0
        (made[name],) = (logs / name).iterdir()
    return made


def drawn_texts(figure: Any) -> list[tuple[str, Any]]:
    """Every text matplotlib drew, with its box: titles, axis labels, tick labels inside the view, legends, notes."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    texts = list(figure.texts)
    for axes in figure.axes:
        texts += [axes.title, axes.xaxis.label, axes.yaxis.label, *axes.texts]
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            texts += [label for tick in axis.get_major_ticks() if low - 1e-9 <= tick.get_loc() <= high + 1e-9
                      for label in (tick.label1, tick.label2)]
        if axes.get_legend() is not None:
            texts += list(axes.get_legend().get_texts())
    boxes = [(text.get_text(), text.get_window_extent(renderer)) for text in texts
             if text.get_visible() and text.get_text().strip()]
    return [(text, box) for text, box in boxes if box.width > 0 and box.height > 0]


def overlapping(boxes: list[tuple[str, Any]]) -> list[str]:
    return [f"{a} / {b}" for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 1
            and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 1]


def one_two_five(ticks: list[str]) -> bool:
    """Log-axis labels that read 1, 2, 5, 10, 20, ... in plain numbers, rising."""
    values = [float(tick.replace("\u2212", "-")) for tick in ticks]
    mantissas = {round(value / 10 ** math.floor(math.log10(value)), 6) for value in values}
    return bool(values) and values == sorted(set(values)) and mantissas <= {1.0, 2.0, 5.0}


def job_page(job: Path, where: Path) -> Path:
    """analyze.py JOB --html's page of a job, written under `where`."""
    page = where / "job.html"
    write_job_page(job, page, LENIENT)
    return page


def copies(job: Path, where: Path, count: int) -> Path:
    """`count` copies of a job under one log directory, each with an id of its own."""
    for index in range(count):
        copy = Path(shutil.copytree(job, where / f"{job.name}-copy{index:02d}"))
        meta = json.loads((copy / "meta.json").read_text())
        (copy / "meta.json").write_text(json.dumps({**meta, "job_id": copy.name}))
    return where


@pytest.mark.slow
@pytest.mark.parametrize(("name", "count"), [("streams", 1), ("one stream", 1), ("streams", 30)])
def test_the_plot_of_1_or_30_jobs_has_no_text_over_text(jobs: dict[str, Path], tmp_path: Path, name: str,
                                                         count: int) -> None:
    logs = copies(jobs[name], tmp_path, count)
    figure, left_out = jobs_figure(load_jobs(logs, rules=LENIENT).jobs)
    assert len(left_out) == max(0, count - 6)
    boxes = drawn_texts(figure)
    assert overlapping(boxes) == []
    texts = [text for text, _ in boxes]
    # One job is named by its id; 30 by J1 to J30, which the key under the figure names.
    assert (f"{jobs[name].name}-copy00: requests/s" in " ".join(texts)) == (count == 1)
    assert ("J30" in texts and "over time: J1 to J6; left out: J7 to J30" in texts) == (count == 30)
    renderer = figure.canvas.get_renderer()
    for axes in figure.axes:
        legend = axes.get_legend()
        if legend is not None:   # beside or under its axes, never on the data
            assert not legend.get_window_extent(renderer).overlaps(axes.get_window_extent(renderer)), axes.get_title()
        if "requests/s" in axes.get_title() or axes.get_title().startswith("CPU"):
            assert axes.get_ylim()[0] == 0, axes.get_title()
        if axes.get_ylabel() == "stream" or axes.get_xlabel() == "stream":
            axis = axes.yaxis if axes.get_ylabel() == "stream" else axes.xaxis
            low, high = sorted(axis.get_view_interval())
            shown = [tick for tick in axis.get_ticklocs() if low <= tick <= high]
            assert shown and all(float(tick).is_integer() for tick in shown), shown
        if axes.get_yscale() == "log":
            low, high = sorted(axes.yaxis.get_view_interval())
            assert one_two_five([tick.label1.get_text() for tick in axes.yaxis.get_major_ticks()
                                 if low <= tick.get_loc() <= high])
        if axes.get_title().startswith("CPU"):   # over at least one sampling interval: never a tick over a gap
            assert max(max(line.get_ydata(), default=0) for line in axes.get_lines()) <= 100 * (os.cpu_count() or 1)


@pytest.mark.slow
@pytest.mark.browser
def test_a_stream_jobs_page_draws_rates_latency_missed_frames_and_processes(jobs: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    seen = render(job_page(jobs["streams"], tmp_path))
    assert (seen.errors, seen.fetched, seen.misfit_axes, seen.overlaps, seen.legends_on_data) == ((), (), (), (), ())
    plots = {plot["id"]: plot for plot in seen.drawn}
    assert list(plots) == ["job-stages", "job-rates", "job-latency", "job-missed", "job-processes"]
    rates = plots["job-rates"]
    assert rates["names"] == ["offered", "served", "2 streams x 30 fps", "steady state"]
    assert rates["axes"]["yaxis"]["range"][0] == 0 and rates["axes"]["yaxis"]["ticks"][0] == "0"
    window = float(rates["title"].split(" over ")[1].split(" s ")[0])
    assert window >= 0.1   # the sampler's interval
    assert plots["job-latency"]["names"][0] == "an item"
    assert plots["job-latency"]["names"][1].startswith("rolling p99 over ")
    assert plots["job-missed"]["axes"]["yaxis"]["ticks"] == ["0", "1"]   # whole streams
    assert plots["job-missed"]["axes"]["yaxis"]["title"] == "stream"
    stages = plots["job-stages"]["axes"]["xaxis"]
    assert stages["type"] == "log" and one_two_five(stages["ticks"])   # a 20 ms step beside a copy of 0.05 ms
    cpu = plots["job-processes"]["axes"]["yaxis"]
    assert cpu["range"][0] == 0 and cpu["range"][1] <= 100 * (os.cpu_count() or 1)
    assert {"client", "step0-g0-r0"} <= set(plots["job-processes"]["names"])


@pytest.mark.slow
@pytest.mark.browser
def test_a_schedule_jobs_page_names_its_spans_with_their_served_rate_and_p99(jobs: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    page = job_page(jobs["schedule"], tmp_path)
    text = page.read_text()
    body = text[text.index("</head>"):]
    assert "steady state" not in body
    row = load_jobs([jobs["schedule"]], rules=LENIENT).jobs.to_pylist()[0]
    spans = json.loads(row["schedule_spans"])
    assert [span["span"] for span in spans] == ["100@0.5s", "300@0.25s"]
    assert [span["begins_s"] for span in spans] == [0.0, 0.5]
    assert sum(span["requests"] for span in spans) == 240
    assert all(span["served_per_s"] > 0 and span["p99_ms"] > 0 for span in spans)
    assert "<th>span</th><th>from s in each cycle</th><th>asked req/s</th><th>requests</th><th>served req/s</th>" in body
    assert f"<td>100@0.5s</td><td>0</td><td>100</td><td>{spans[0]['requests']}</td>" in body
    assert "rate schedule, each span over its repetitions (asked -&gt; served req/s, p99): 100@0.5s 100 -&gt; " in body
    seen = render(page)
    assert (seen.errors, seen.misfit_axes, seen.overlaps, seen.legends_on_data) == ((), (), (), ())
    (rates,) = [plot for plot in seen.drawn if plot["id"] == "job-rates"]
    assert rates["names"] == ["offered", "served", f"schedule {SCHEDULE}"]
