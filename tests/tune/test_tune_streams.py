"""rnb-tune --objective streams on config/streams-example.json: the most streams at 30 fps, worked by hand.

The example is one step of 20 ms a frame (0.3 ms of harness on each call in
the hand-made profiles) with a deadline of 250 ms.  One replica serves
49.3 frames/s: 1 stream at 30 fps (30 frames/s), not 2 (60).  Two replicas
serve 98.5: 3 streams (90), not 4 (120, a backlog growing by a fifth of
each second, past 250 ms after about 1.1 s).  The real run tunes one CPU
slot and measures 1 stream, as bench row S1 does.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rnb.tune.cli import main
from rnb.tune.estimate import Estimator
from rnb.tune.profile import Bench
from rnb.tune.search import Goal, Memory, Search
from rnb.tune.space import Budget
from rnb.tune.streams import StreamGoal, predicted_streams, simulated_missed_fraction, stream_finalists
from rnb.tune.tuning_config import read_space
from tests.support.tune_support import REPO, find_browser, hand_profiles, render

EXAMPLE = REPO / "config" / "streams-example.json"
BENCH = Bench("cpu", "local", host="test-host")
TUNE = REPO / "scripts" / "tune.py"


@pytest.fixture(scope="module")
def found() -> Search:
    """Every candidate of the example on 2 CPU slots (1 or 2 replicas), predicted from hand-made profiles."""
    space = read_space(json.loads(EXAMPLE.read_text()), str(EXAMPLE), Budget(cpu_slots=2))
    estimator = Estimator(space, hand_profiles(space, BENCH), BENCH, 250.0, 99.0, items=1200)
    search = Search(space, estimator, Goal(), Memory({}))
    search.exhaustive()
    return search


def test_the_goal_takes_the_config_s_deadline_unless_one_is_given(found: Search) -> None:
    assert StreamGoal.of(found.space, 30.0, 0.01, None) == StreamGoal(30.0, 0.01, 250.0, "queue")
    assert StreamGoal.of(found.space, 30.0, 0.01, 40.0).deadline_ms == 40.0
    bare = read_space({**json.loads(EXAMPLE.read_text()), "run": {}}, str(EXAMPLE), Budget(cpu_slots=1))
    assert StreamGoal.of(bare, 25.0, 0.01, None).deadline_ms == 40.0   # one frame period


def test_the_simulation_sustains_the_streams_worked_by_hand(found: Search) -> None:
    goal = StreamGoal(30.0, 0.01, 250.0)
    by_replicas = {e.candidate.steps[0].groups[0].replicas: predicted_streams(found.estimator, e.candidate, goal)
                   for e in found.evaluated.values()}
    assert by_replicas == {1: 1, 2: 3}


def test_finalists_are_ranked_by_the_streams_they_sustain(found: Search) -> None:
    ranked = stream_finalists(found, StreamGoal(30.0, 0.01, 250.0))
    assert [(f.predicted, f.devices) for f in ranked] == [(3, 2), (1, 1)]


def test_the_simulated_drop_policy_processes_what_one_40_ms_step_can_take() -> None:
    # One stream at 30 fps (a frame every 33.3 ms) into one step of 40 ms + 0.3 ms of harness: the step takes a
    # frame every 40.3 ms, so under drop 1 - 33.3 / 40.3 = 17.3% of the frames are dropped, and the others wait at
    # most a frame period, far inside the 250 ms deadline.  Under queue the backlog grows 7 ms a frame and passes
    # 250 ms after about 36 frames: all but those are late.
    document = {**json.loads(EXAMPLE.read_text()), "run": {"stream_policy": "drop"}}
    document["pipeline"][0]["ms"] = 40
    space = read_space(document, "slow.json", Budget(cpu_slots=1))
    pipeline = Estimator(space, hand_profiles(space, BENCH), BENCH, 250.0, 99.0).pipeline(space.minimal())
    drop = StreamGoal.of(space, 30.0, 0.01, 250.0)
    assert drop.policy == "drop" and drop.load_flags(1)[-2:] == ["--stream-policy", "drop"]
    assert simulated_missed_fraction(pipeline, drop, 1, 600, 0) == pytest.approx(1 - (1000 / 30) / 40.3, abs=0.01)
    queue = dataclasses.replace(drop, policy="queue")
    assert simulated_missed_fraction(pipeline, queue, 1, 600, 0) == pytest.approx((600 - 36) / 600, abs=0.01)
    assert simulated_missed_fraction(pipeline, drop, 2, 600, 0) == pytest.approx(1 - (1000 / 60) / 40.3, abs=0.01)


@pytest.mark.parametrize(("flags", "message"), [
    (["--objective", "streams"], "command line: --fps: expected each stream's frame rate beside --objective streams, "
                                 "found none"),
    (["--objective", "streams", "--fps", "30", "--streams-bound", "2"],
     "command line: --streams-bound: expected a fraction from 0 to 1, found 2"),
    (["--objective", "streams", "--fps", "-30"], "command line: --fps: expected a number > 0, found -30"),
    (["--objective", "streams", "--fps", "30", "--latency-bound-ms", "80"],
     "command line: --latency-bound-ms: expected none beside --objective streams, whose frames' bound is --deadline-ms, "
     "found 80"),
    ([], "command line: --latency-bound-ms: expected a value (rnb-tune requires it, except under --objective streams), "
         "found none"),
])
def test_a_bad_streams_request_is_one_sentence_and_exit_2(tmp_path: Path, flags: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    try:
        code = main(["-c", str(EXAMPLE), "--cpu-slots", "1", "--out", str(out), *flags])
    except SystemExit as exit:   # argparse's own refusals
        code = int(exit.code or 0)
    assert code == 2
    assert capsys.readouterr().err == f"{message}\n"
    assert not out.exists()


# Serial: its verification holds a 30 fps stream to a deadline on this host's cores, which another pytest worker's
# jobs beside it made it miss (more than 1% of the frames late, in one full run of the test command).
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tuner_finds_the_example_s_one_stream_and_writes_a_config_that_runs_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(TUNE), "-c", str(EXAMPLE), "--cpu-slots", "1", "--objective", "streams",
                           "--fps", "30", "--out", str(out), "--profile-calls", "40", "--sim-items", "800"],
                          cwd=REPO, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "streams.json").read_text())
    assert (report["streams"], report["fps"], report["deadline_ms"]) == (1, 30.0, 250.0)
    [finalist] = report["finalists"]
    assert (finalist["predicted_streams"], finalist["streams"], finalist["failed_at"]) == (1, 1, 2)
    assert [trial["streams"] for trial in finalist["trials"]] == [1, 2]
    assert finalist["trials"][0]["missed_fraction"] <= 0.01 < finalist["trials"][1]["missed_fraction"]
    best, bound, wrote = done.stdout.splitlines()[-3:]
    assert best == "best: step 0: 1 x cpu: 1 stream at 30 fps"
    # Two streams saturate the step; where its runner also waited for a core (a loaded host), the cores share it.
    assert bound.startswith("what bounds it: at 2 streams step 0 (AsyncSleep) was busy ") and bound.endswith(
        ("saturated: the pipeline, not the host, missed the frames.",
         "not the step alone, missed the frames.")), bound
    assert wrote == (f"wrote {out / 'best.json'}, {out / 'streams.json'}, {out / 'candidates.parquet'}, "
                     f"{out / 'streams.png'}, {out / 'report.html'}")
    assert report["what_bounds_it"] == finalist["what_bounds_it"] == done.stdout.splitlines()[-2]
    # The same report as the latency objective's: every candidate with its prediction, a plot, one page.
    (row,) = pq.read_table(out / "candidates.parquet").to_pylist()
    assert (row["predicted_streams"], row["measured_streams"], row["failed_at"], row["prediction_close"]) == (1, 1, 2, True)
    assert row["bound"] == report["what_bounds_it"] and Path(row["job_log"]).name in finalist["trials"][0]["job_dir"]
    assert (out / "streams.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert "Best, as measured: step 0: 1 x cpu: 1 stream at 30 fps" in page and report["what_bounds_it"] in page
    if find_browser() is not None:
        seen = render(out / "report.html")
        assert (seen.errors, seen.fetched, seen.misfit_axes, seen.overlaps, seen.legends_on_data) == ((),) * 5
        assert [plot["id"] for plot in seen.drawn][:2] == ["streams", "finalist-1-stages"]
    best = json.loads((out / "best.json").read_text())
    assert best["run"] | {"videos": 0} == {"streams": 1, "fps": 30, "deadline_ms": 250, "videos": 0, "warmup": 0}
    check = subprocess.run([sys.executable, "benchmark.py", "-c", str(out / "best.json"), "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
