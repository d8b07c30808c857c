"""Camera streams (--streams N --fps F): arrival phases, late and dropped frames worked by hand, refusals."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import matplotlib.image
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from rnb import cli
from rnb.analysis.html import write_job_page
from rnb.analysis.jobs import ValidityRules, load_jobs
from rnb.analysis.plots import plot_jobs
from rnb.analysis.report import format_report
from rnb.analysis.streams import SCREEN_ROWS, format_streams
from rnb.engines.streams import Dealer, write_per_stream
from rnb.load import LoadSettings, mode_of

STEP_MS = 40.0   # one AsyncSleep step: at most 25 frames/s, so one stream at 30 fps is too much for it
FRAMES = 60      # two seconds of one stream at 30 fps


def due_times(settings: LoadSettings, count: int, seed: int = 0) -> list[tuple[float, int, int]]:
    arrivals = itertools.islice(mode_of(settings).arrivals(settings, seed), count)
    return [(a.due_s, a.stream, a.frame) for a in arrivals]  # type: ignore[misc]


def test_spread_streams_issue_stream_s_at_phase_s_over_n_f_every_frame_period() -> None:
    got = due_times(LoadSettings(streams=4, fps=30), 12)
    expected = sorted((frame / 30 + stream / 120, stream, frame) for frame in range(3) for stream in range(4))
    assert [(stream, frame) for _, stream, frame in got] == [(stream, frame) for _, stream, frame in expected]
    assert [due for due, _, _ in got] == pytest.approx([due for due, _, _ in expected], abs=1e-12)


def test_aligned_streams_issue_together_and_random_phases_stay_within_the_period() -> None:
    aligned = due_times(LoadSettings(streams=3, fps=25, stream_phase="aligned"), 9)
    assert aligned == [(frame / 25, stream, frame) for frame in range(3) for stream in range(3)]
    phases = [due for due, _, frame in due_times(LoadSettings(streams=50, fps=20, stream_phase="random"), 50, seed=3)]
    assert all(0 <= phase < 0.05 for phase in phases) and len(set(phases)) == 50
    assert phases == [due for due, _, _ in due_times(LoadSettings(streams=50, fps=20, stream_phase="random"), 50, seed=3)]


def test_jitter_delays_each_frame_by_less_than_the_jitter_and_keeps_each_stream_in_order() -> None:
    got = due_times(LoadSettings(streams=2, fps=10, jitter_ms=30), 400)
    for due, stream, frame in got:
        assert 0 <= due - (frame / 10 + stream / 20) < 0.030
    for stream in (0, 1):
        frames = [frame for _, s, frame in got if s == stream]
        assert frames == sorted(frames) and len(frames) == 200
    assert [due for due, _, _ in got] == sorted(due for due, _, _ in got)


def test_each_stream_reads_its_own_episodes_dealt_round_robin() -> None:
    dealer = Dealer(iter(range(100)), 3)
    assert [dealer.next_for(2), dealer.next_for(2), dealer.next_for(0), dealer.next_for(1), dealer.next_for(2)] == [2, 5, 0, 1, 8]


def test_step_0_is_given_each_frame_s_stream_and_index_as_its_card_has_them(tmp_path: Path, job_log) -> None:
    config = tmp_path / "echo.json"
    config.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "tests.support.fixture_models.StreamEcho", "queue_groups": [{"gpus": [-1]}]}]}))
    assert cli.main(["-c", str(config), "--streams", "2", "--fps", "50", "-v", "8", "--warmup", "0", "-q",
                     "--log-dir", str(tmp_path / "logs")]) == 0
    rows = job_log(tmp_path / "logs").rows
    assert sorted((row["given_stream"], row["given_frame"]) for row in rows) == [(s, f) for s in (0, 1) for f in range(4)]
    assert all((row["given_stream"], row["given_frame"]) == (row["stream"], row["frame"]) for row in rows)


@pytest.fixture
def slow_step(tmp_path: Path) -> Path:
    config = tmp_path / "slow.json"
    config.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.AsyncSleep", "queue_groups": [{"gpus": [-1]}], "ms": STEP_MS}]}))
    return config


def run_one_stream(config: Path, logs: Path, policy: str, job_log) -> tuple[dict, list[dict]]:
    code = cli.main(["-c", str(config), "--streams", "1", "--fps", "30", "--stream-policy", policy, "-v", str(FRAMES),
                     "--warmup", "0", "-q", "--log-dir", str(logs)])
    assert code == 0
    log = job_log(logs)
    return log.meta, log.rows


def test_one_stream_at_30_fps_into_a_40_ms_step_is_late_on_every_frame_under_queue(slow_step, tmp_path, job_log) -> None:
    meta, rows = run_one_stream(slow_step, tmp_path / "logs", "queue", job_log)
    streams = meta["streams"]
    # Each frame takes 40 ms, more than its deadline of one frame period (33.3 ms): every frame is late.
    assert (streams["offered"], streams["processed"], streams["late"], streams["dropped"]) == (FRAMES, FRAMES, FRAMES, 0)
    assert sorted(row["frame"] for row in rows) == list(range(FRAMES))
    assert {row["stream"] for row in rows} == {0} and all(row["late"] for row in rows)
    for row in rows:   # the deadline is the frame's due time plus one period; the client sends at or after it
        assert row["enqueue"] >= row["deadline"] - 1 / 30 - 1e-6
    assert meta["args"]["load_mode"] == "streams" and "-s1-fps30-v60" in meta["job_id"]
    # analyze.py reads the same figures back: its columns, its report, and a lateness panel in its plot.
    (row,) = load_jobs(tmp_path / "logs", rules=ValidityRules(min_duration_s=0, min_items=1)).jobs.to_pylist()
    assert (row["load_mode"], row["streams"], row["fps"], row["mean_interval_ms"]) == ("streams", 1, 30.0, None)
    assert (row["frames_offered"], row["frames_late"], row["frames_dropped"], row["frames_missed_fraction"]) == (
        FRAMES, FRAMES, 0, 1.0)
    strict = ValidityRules(min_duration_s=0, min_items=1, min_frames_per_stream=FRAMES + 1)
    (judged,) = load_jobs(tmp_path / "logs", rules=strict).jobs.to_pylist()
    # Both: too few frames per stream, and 30 frames a second offered to a step that serves 25 (its queue grew).
    frames, overload = judged["invalid_because"].split(" overloaded: ")
    assert frames.endswith("1 of 1 streams offered fewer than 61 frames each (the fewest 60).")
    offered, served = (float(rate) for rate in re.fullmatch(r"offered ([\d.]+)/s, served ([\d.]+)/s\.", overload).groups())
    assert served < 0.95 * offered
    report = format_report(load_jobs(tmp_path / "logs").jobs)
    assert "streams: 1 at 30 fps, policy queue, deadline 33.3 ms: 60 frames offered, 60 processed, 60 late" in report
    write_job_page(tmp_path / "logs" / meta["job_id"], tmp_path / "job.html")
    page = (tmp_path / "job.html").read_text()
    assert "60 frames offered, 60 processed, 60 late, 0 dropped (100.0% missed)" in page
    assert "<th>late</th><th>dropped</th>" in page and "<td>0</td><td>60</td><td>60</td><td>60</td><td>0</td>" in page
    plain, streamed = tmp_path / "plain.png", tmp_path / "streamed.png"
    plot_jobs(pa.Table.from_pylist([{**row, "streams_record": None}]), str(plain))
    plot_jobs(pa.Table.from_pylist([row]), str(streamed))
    assert matplotlib.image.imread(streamed).shape[0] == matplotlib.image.imread(plain).shape[0] + 300


def test_one_stream_at_30_fps_into_a_40_ms_step_drops_what_the_step_cannot_take(slow_step, tmp_path, job_log) -> None:
    meta, rows = run_one_stream(slow_step, tmp_path / "logs", "drop", job_log)
    streams = meta["streams"]
    # The step takes at most one frame per 40 ms: over the ~2 s of 60 frames at most 51 are processed (about 25 of
    # every 30); each other frame was replaced by a newer one while it waited, and -v counts it as offered.
    assert streams["offered"] == FRAMES == streams["processed"] + streams["dropped"]
    assert streams["processed"] == len(rows) <= 52 and streams["dropped"] >= 8
    frames = [row["frame"] for row in sorted(rows, key=lambda row: row["enqueue"])]
    assert frames == sorted(set(frames)) and frames[0] == 0
    assert streams["per_stream"][0]["dropped"] == streams["dropped"] and "-s1-fps30-drop-v60" in meta["job_id"]
    # The log keeps every frame offered, dropped ones too, each with its due time and fate; -v counts them all.
    job = tmp_path / "logs" / meta["job_id"]
    offered = pq.read_table(job / "offered.parquet").to_pylist()
    assert [row["item_id"] for row in offered] == list(range(FRAMES))
    assert [(row["stream"], row["frame"]) for row in offered] == [(0, frame) for frame in range(FRAMES)]
    fates = {row["item_id"]: row["fate"] for row in offered}
    assert {item for item, fate in fates.items() if fate == "processed"} == {row["item_id"] for row in rows}
    assert sum(fate == "dropped" for fate in fates.values()) == streams["dropped"]
    assert set(fates.values()) == {"processed", "dropped"}
    due = {row["item_id"]: row["due"] for row in rows}
    assert all(abs(row["due"] - due[row["item_id"]]) < 1e-6 for row in offered if row["item_id"] in due)
    assert [round(row["due"] - offered[0]["due"], 6) for row in offered] == [round(k / 30, 6) for k in range(FRAMES)]
    # Replayed, the job offers the same 60 frames at the same times, on their stream and with their frame index,
    # though the config's run names streams of its own (a flag's load mode replaces the config's).
    replay = tmp_path / "replay"
    assert cli.main(["-c", "config/streams-example.json", "--arrivals", str(job), "-v", str(FRAMES), "--warmup", "0",
                     "-q", "--log-dir", str(replay)]) == 0
    again = job_log(replay)
    assert again.meta["args"]["load_mode"] == "trace" and again.meta["args"]["streams"] is None
    assert sorted((row["stream"], row["frame"]) for row in again.rows) == [(0, frame) for frame in range(FRAMES)]
    replayed = sorted(again.rows, key=lambda row: row["item_id"])
    assert [round(row["due"] - replayed[0]["due"], 6) for row in replayed] == [round(k / 30, 6) for k in range(FRAMES)]


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--streams", "2", "--fps", "-30"], "command line: --fps: expected a number >= 1.16e-05, found -30"),
    (["--streams", "2", "--fps", "0"], "command line: --fps: expected a number >= 1.16e-05, found 0"),
    (["--streams", "2", "--fps", "1e-300"], "command line: --fps: expected a number >= 1.16e-05, found 1e-300"),
    (["--streams", "2", "--fps", "5e-324"], "command line: --fps: expected a number >= 1.16e-05, found 5e-324"),
    (["--streams", "0"], "command line: --streams: expected an integer from 1 to 10000, found 0"),
    (["--streams", "1000000000"], "command line: --streams: expected an integer from 1 to 10000, found 1000000000"),
    (["--streams", str(10**20)], f"command line: --streams: expected an integer from 1 to 10000, found {10**20}"),
    (["--streams", "2", "--deadline-ms", "1e9"],
     "command line: --deadline-ms: expected a number > 0 and <= 8.64e+07, found 1e9"),
    (["--fps", "30"], "command line: --fps: expected --streams (or run.streams) beside it, found none"),
    (["--streams", "2", "--stream-policy", "leaky"],
     'command line: --stream-policy: expected one of "queue", "drop", found \'leaky\''),
    (["--streams", "2", "--concurrency", "4"],
     "command line: --streams: expected one load mode, found --streams and --concurrency together"),
    (["--streams", "2", "--jitter-ms", "40"],
     "command line: --jitter-ms: expected a jitter below the frame period (33.3333 ms at 30 fps), found 40"),
])
def test_a_bad_stream_flag_is_one_sentence_and_exit_2(argv: list[str], sentence: str, capsys) -> None:
    assert cli.main(["-c", "config/toy.json", "--check", *argv]) == 2
    assert capsys.readouterr().err.strip() == sentence


def test_a_bad_stream_run_key_names_its_json_path(tmp_path: Path, capsys) -> None:
    document = json.loads(Path("config/streams-example.json").read_text())
    config = tmp_path / "c.json"
    config.write_text(json.dumps({**document, "run": {"streams": 2, "stream_policy": "leaky"}}))
    assert cli.main(["-c", str(config), "--check"]) == 2
    assert capsys.readouterr().err.strip() == (f'{config}: run.stream_policy: expected one of "queue", "drop", '
                                               'found the string "leaky"')
    config.write_text(json.dumps({**document, "run": {"fps": 30}}))
    assert cli.main(["-c", str(config), "--check"]) == 2
    assert capsys.readouterr().err.strip() == f"{config}: run.fps: expected --streams (or run.streams) beside it, found none"


def test_the_summary_shows_a_screenful_of_streams_and_the_file_holds_every_one(tmp_path: Path) -> None:
    per_stream = [{"stream": s, "offered": 4, "processed": 4, "late": s % 2, "dropped": 0, "p50_ms": 1.5, "p99_ms": 2.5,
                   "fps": 30.0} for s in range(25)]
    record = {"count": 25, "fps": 30.0, "policy": "queue", "deadline_ms": 33.3, "offered": 100, "processed": 100,
              "late": 12, "dropped": 0, "per_stream": per_stream}
    lines = format_streams(record).splitlines()
    assert len(lines) == 2 + SCREEN_ROWS + 1 and lines[2 + SCREEN_ROWS - 1].split()[0] == str(SCREEN_ROWS - 1)
    assert lines[-1] == ("  ... and 5 more streams: every stream is in meta.json (streams.per_stream) and in "
                         "streams.csv")
    assert len(format_streams({**record, "per_stream": per_stream[:SCREEN_ROWS]}).splitlines()) == 2 + SCREEN_ROWS
    write_per_stream(tmp_path / "streams.csv", record)
    assert pa_csv.read_csv(tmp_path / "streams.csv").to_pylist() == per_stream
