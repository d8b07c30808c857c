"""Trace replay (--arrivals) and rate schedules (--rate-schedule): arrival times against their definition, the
LoadGen scenario names, and the refusals of a bad trace or schedule."""
from __future__ import annotations

import itertools
import math
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rnb import cli
from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import ValidityRules, summarize_job
from rnb.load import LoadSettings, mode_of
from rnb.load.inputs import Span, parse_schedule, read_trace


def due(settings: LoadSettings, count: int, seed: int = 0) -> list[float]:
    return [arrival.due_s for arrival in itertools.islice(mode_of(settings).arrivals(settings, seed), count)]  # type: ignore[misc]


def test_a_csv_trace_is_replayed_exactly_with_its_streams(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("offset_s,stream\n0,0\n0.010,1\n0.0105,0\n2.5,1\n")
    settings = LoadSettings(arrivals=str(trace))
    arrivals = list(mode_of(settings).arrivals(settings, 0))
    assert mode_of(settings).name == "trace" and mode_of(settings).job_label(settings) == "trace"
    assert [(a.due_s, a.stream, a.frame) for a in arrivals] == [(0.0, 0, 0), (0.01, 1, 0), (0.0105, 0, 1), (2.5, 1, 1)]


def test_a_parquet_trace_and_a_recorded_job_are_replayed_from_their_first_time(tmp_path: Path) -> None:
    pq.write_table(pa.table({"offset_s": [0.5, 0.75, 3.0]}), tmp_path / "t.parquet")
    assert due(LoadSettings(arrivals=str(tmp_path / "t.parquet")), 3) == [0.5, 0.75, 3.0]
    job = tmp_path / "job"
    job.mkdir()
    pq.write_table(pa.table({"item_id": [0, 1, 2], "enqueue": [1000.25, 1000.0, 1001.5]}), job / "timings.parquet")
    assert read_trace(str(job)) == ((0.0, 0.25, 1.5), None)


def test_a_job_replays_a_trace_at_its_offsets(tmp_path: Path, job_log) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("offset_s\n" + "\n".join(f"{0.05 * k + (0.02 if k % 3 else 0):.3f}" for k in range(12)) + "\n")
    code = cli.main(["-c", "config/toy.json", "--arrivals", str(trace), "-v", "12", "--warmup", "0", "-q",
                     "--log-dir", str(tmp_path / "logs")])
    log = job_log(tmp_path / "logs")
    assert code == 0 and log.meta["args"]["load_mode"] == "trace" and "-trace-v12" in log.meta["job_id"]
    rows = sorted(log.rows, key=lambda row: row["item_id"])
    # Each request was due at its offset from the client's start, and went at or after it (how long after is the
    # machine's: bench row S2).
    assert [round(row["due"] - rows[0]["due"], 6) for row in rows] == list(read_trace(str(trace))[0])
    assert all(row["enqueue"] >= row["due"] for row in rows)


def test_a_schedule_is_poisson_at_each_spans_rate_for_its_span_and_repeats() -> None:
    settings = LoadSettings(rate_schedule="100@10s,300@5s")
    times = due(settings, 6000, seed=1)
    assert times == sorted(times)
    first = [t for t in times if t < 10]
    burst = [t for t in times if 10 <= t < 15]
    again = [t for t in times if 15 <= t < 25]
    # Counts of a Poisson process: mean rate x span, within 4 standard deviations.
    for got, mean in ((len(first), 1000), (len(burst), 1500), (len(again), 1000)):
        assert abs(got - mean) < 4 * math.sqrt(mean)
    assert mode_of(settings).job_label(settings) == "sched100x10_300x5"


def test_a_schedule_job_must_measure_one_whole_cycle_of_its_schedule() -> None:
    args = {"rate_schedule": "100@1s,300@0.5s", "seed": 1, "warmup": 5, "videos": 400}
    times = due(LoadSettings(rate_schedule="100@1s,300@0.5s"), 1000, seed=1)
    # The measured requests start at the 6th (after 5 of warm-up); the cycle lasts 1.5 s from its due time on.
    needed = 5 + sum(1 for when in times[5:] if when < times[5] + 1.5)
    assert abs(needed - 5 - 250) < 4 * math.sqrt(250)   # 100 x 1 s + 300 x 0.5 s expected per cycle
    schedule = mode_of(LoadSettings(rate_schedule="100@1s,300@0.5s"))
    assert schedule.short_of_its_load(args, needed) is None
    assert schedule.short_of_its_load(args, needed - 1) == (
        f"the {needed - 6} measured requests cover less than one cycle of the rate schedule 100@1s,300@0.5s "
        f"(1.5 s from the first measured one, {needed - 5} requests).")
    assert mode_of(LoadSettings()).short_of_its_load({"mean_interval_ms": 3.0}, 1) is None   # Poisson: any window


def test_analysis_calls_a_schedule_job_that_stopped_inside_its_cycle_invalid(tmp_path: Path, job_log) -> None:
    argv = ["-c", "config/toy.json", "--rate-schedule", "400@0.25s,100@0.25s", "--warmup", "0", "-q", "--seed", "3"]
    assert cli.main([*argv, "-v", "40", "--log-dir", str(tmp_path / "short")]) == 0
    short = summarize_job(read_job(job_log(tmp_path / "short").dir), ValidityRules(min_items=1, min_duration_s=0))
    times = due(LoadSettings(rate_schedule="400@0.25s,100@0.25s"), 400, seed=3)
    needed = sum(1 for when in times if when < times[0] + 0.5)   # the cycle from the first request's due time
    assert short["validity"] == "INVALID" and (
        f"the 40 measured requests cover less than one cycle of the rate schedule 400@0.25s,100@0.25s (0.5 s from "
        f"the first measured one, {needed} requests).") in short["invalid_because"]
    assert cli.main([*argv, "-v", str(needed), "--log-dir", str(tmp_path / "whole")]) == 0
    whole = summarize_job(read_job(job_log(tmp_path / "whole").dir), ValidityRules(min_items=1, min_duration_s=0))
    assert "rate schedule" not in (whole["invalid_because"] or "")


def test_a_ramp_rises_linearly_over_its_span() -> None:
    times = list(Span(0, 400, 10).arrivals(5.0, random.Random(2)))
    assert all(5.0 <= t < 15.0 for t in times)
    halves = sum(t < 10.0 for t in times), sum(t >= 10.0 for t in times)
    # Expected 500 in the first half (rate 0 to 200) and 1500 in the second (200 to 400).
    assert abs(halves[0] - 500) < 4 * math.sqrt(500) and abs(halves[1] - 1500) < 4 * math.sqrt(1500)
    assert parse_schedule("100@10s, 50-150@2.5") == (Span(100, 100, 10), Span(50, 150, 2.5))


@pytest.mark.parametrize(("scenario", "mode", "label"), [
    ("offline", "bulk", "mi0"), ("server", "poisson", "mi3"), ("single-stream", "closed_loop", "c1"),
    ("multi-stream", "multi_stream", "ms8")])
def test_loadgen_scenarios_map_onto_the_load_modes(scenario: str, mode: str, label: str, tmp_path: Path) -> None:
    args = cli.resolve_args(cli.parse_args(["--scenario", scenario]), cli.load_config("config/toy.json"))
    assert (mode_of(args.load).name, mode_of(args.load).job_label(args.load)) == (mode, label)
    assert args.load.scenario == scenario


def bad_trace(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("argv", "sentence"), [
    (lambda t: ["--arrivals", bad_trace(t, "offset_s\n0\n2\n1\n")],
     "command line: --arrivals: expected offsets sorted from the earliest in {t}/bad.csv, found 1 after 2 in row 3"),
    (lambda t: ["--arrivals", bad_trace(t, "offset_s,stream\n0,0\n,1\n1,0\n")],
     "command line: --arrivals: expected an offset in seconds from 0 to 86400 (one day) in every row of {t}/bad.csv, "
     "found a blank cell in row 2"),
    (lambda t: ["--arrivals", bad_trace(t, "time\n0\n")],
     "command line: --arrivals: expected a column offset_s in {t}/bad.csv, found the columns time"),
    (lambda t: ["--arrivals", bad_trace(t, "offset_s\n0\n1\n"), "-v", "3"],
     "command line: --arrivals: expected at least the 3 requests to finish (-v), found 2 arrival times in {t}/bad.csv"),
    (lambda t: ["--arrivals", str(t / "none.csv")],
     "command line: --arrivals: expected a CSV or Parquet file of arrival offsets, or a job's log directory, found "
     "nothing at {t}/none.csv"),
    (lambda t: ["--rate-schedule", "100@10s,fast@5s"], "command line: --rate-schedule: expected spans RATE@SECONDS or "
     "RATE-RATE@SECONDS separated by commas, such as \"100@10s,300@5s\", found 'fast@5s'"),
    (lambda t: ["--rate-schedule", "100@0s"], "command line: --rate-schedule: expected each span to last more than 0 s "
     "and at most 86400 s (one day), found '100@0s'"),
    (lambda t: ["--rate-schedule", "100@1s", "--concurrency", "2"],
     "command line: --rate-schedule: expected one load mode, found --rate-schedule and --concurrency together"),
    (lambda t: ["--scenario", "offline", "-mi", "5"], "command line: --scenario: expected -mi/--mean_interval_ms 0 or "
     "none beside it (the offline scenario), found -mi/--mean_interval_ms 5.0"),
    (lambda t: ["--scenario", "batch"], "command line: --scenario: expected one of \"offline\", \"server\", "
     "\"single-stream\", \"multi-stream\", found 'batch'"),
])
def test_a_bad_trace_schedule_or_scenario_is_one_sentence_and_exit_2(argv, sentence: str, tmp_path: Path, capsys) -> None:
    assert cli.main(["-c", "config/toy.json", "--check", "-v", "2", "--warmup", "0", *argv(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == sentence.format(t=tmp_path)


def written(tmp_path: Path, name: str, content: bytes | pa.Table) -> str:
    path = tmp_path / name
    if isinstance(content, pa.Table):
        pq.write_table(content, path)
    else:
        path.write_bytes(content)
    return str(path)


OFFSETS_EXPECTED = "expected an offset in seconds from 0 to 86400 (one day) in every row of {path}, found "


@pytest.mark.parametrize(("name", "content", "sentence"), [
    ("abc.csv", b"offset_s\n0\n1\nabc\n", OFFSETS_EXPECTED + "'abc' in row 3"),
    ("nan.csv", b"offset_s\n0\nnan\n1\n", OFFSETS_EXPECTED + "NaN in row 2"),
    ("far.csv", b"offset_s\n0\n1e12\n", OFFSETS_EXPECTED + "1e12 in row 2"),
    ("inf.csv", b"offset_s\n0\ninf\n", OFFSETS_EXPECTED + "inf in row 2"),
    ("control.csv", b"offset_s\n0\x01\x1b[31m\n1\n", OFFSETS_EXPECTED + "'0\\x01\\x1b[31m' in row 1"),
    ("blank.csv", b"offset_s\n0\n\n1\n", "expected an arrival in every row of {path}, found row 2 blank"),
    ("stream.csv", b"offset_s,stream\n0,0\n1,x\n",
     "expected a stream number from 0 to 9999 in every row of {path}'s column stream, found 'x' in row 2"),
    ("far_stream.csv", b"offset_s,stream\n0,0\n1,10000\n",
     "expected a stream number from 0 to 9999 in every row of {path}'s column stream, found 10000 in row 2"),
    ("binary.csv", b"\xc5\x00\x1b\x9b garbage",
     "expected a CSV or Parquet file of arrival offsets, or a job's log directory, found {path} not UTF-8 text "
     "(byte 0xc5 at offset 0)"),
    ("nul.csv", b"offset_s\n0\x00\n", OFFSETS_EXPECTED + "'0\\x00' in row 1"),
    ("nan.parquet", pa.table({"offset_s": [0.0, math.nan, 2.0]}), OFFSETS_EXPECTED + "NaN in row 2"),
    ("null.parquet", pa.table({"offset_s": [0.0, None, 2.0]}), OFFSETS_EXPECTED + "a blank cell in row 2"),
    ("text.parquet", pa.table({"offset_s": ["0.0", "1.0"]}),
     "expected numbers in the column offset_s of {path}, found a column of string (row 1: '0.0')"),
    ("stream.parquet", pa.table({"offset_s": [0.0, 1.0], "stream": [0, -1]}),
     "expected a stream number from 0 to 9999 in every row of {path}'s column stream, found -1 in row 2"),
], ids=lambda value: value if isinstance(value, str) and "." in value and " " not in value else "")
def test_a_bad_trace_is_refused_naming_its_row_and_its_value_as_written(tmp_path: Path, name: str, content, sentence: str,
                                                                         capsys) -> None:
    path = written(tmp_path, name, content)
    assert cli.main(["-c", "config/toy.json", "--check", "-v", "2", "--arrivals", path]) == 2
    said = capsys.readouterr().err
    assert said == f"command line: --arrivals: {sentence.format(path=path)}\n"
    assert said.isprintable() or said[:-1].isprintable()


@pytest.mark.parametrize(("schedule", "sentence"), [
    ("-5@10s", "expected rates from 0 to 1e+06 requests/s, found -5 in '-5@10s'"),
    ("100@10s,-3-5@2s", "expected rates from 0 to 1e+06 requests/s, found -3 in '-3-5@2s'"),
    ("nan@10s", "expected rates from 0 to 1e+06 requests/s, found NaN in 'nan@10s'"),
    ("5@1e6s", "expected each span to last more than 0 s and at most 86400 s (one day), found '5@1e6s'"),
    ("1e-9@10s", "expected a schedule that offers at least one request a day on average, found '1e-9@10s', which "
                 "offers one request every 1e+09 s"),
    ("0@10s", "expected a schedule that offers at least one request a day on average, found '0@10s', which offers "
              "no request at all"),
    ("5@\x1b[2J", "expected spans RATE@SECONDS or RATE-RATE@SECONDS separated by commas, such as \"100@10s,300@5s\", "
                  "found '5@\\x1b[2J'"),
])
def test_a_bad_schedule_is_refused_in_a_sentence_whatever_its_first_character(schedule: str, sentence: str,
                                                                             capsys) -> None:
    assert cli.main(["-c", "config/toy.json", "--check", "-v", "2", "--rate-schedule", schedule]) == 2
    assert capsys.readouterr().err == f"command line: --rate-schedule: {sentence}\n"


def test_a_recorded_job_longer_than_a_day_is_refused_as_a_trace(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    pq.write_table(pa.table({"enqueue": [1000.0, 1000.0 + 86401.0]}), job / "timings.parquet")
    with pytest.raises(ValueError, match=r"expected a recorded job whose requests came within 86400 s \(one day\) of "
                                         r"its first, found one 86401 s after it in "):
        read_trace(str(job))


@pytest.mark.slow
def test_a_trace_whose_next_arrival_is_far_off_ends_as_stalled_once_the_pipeline_has_been_idle_for_stall_s(
        tmp_path: Path, job_log) -> None:
    trace = tmp_path / "gap.csv"
    trace.write_text("offset_s\n0\n0.1\n0.2\n1000\n")
    code = cli.main(["-c", "config/toy.json", "--arrivals", str(trace), "-v", "4", "--stall-s", "1.5", "--warmup", "0",
                     "-q", "--log-dir", str(tmp_path / "logs")])
    log = job_log(tmp_path / "logs")
    assert code == 1 and (log.meta["termination_reason"], log.meta["finished_items"]) == ("stalled", 3)
    assert log.meta["failed_process"] == "client" and re.match(
        r"the client \(pid \d+\) has had nothing to send for 1\.\d s with every request sent so far finished: request 3 "
        r"is due 1000\.0 s after the start, 99\d\.\d s from now \(a load this sparse needs a larger --stall-s\)",
        log.meta["error"])
