"""No job waits for ever: a process alive but making no progress ends the job as stalled, with its stacks; and
no job that is working is ended as stalled.

Jobs run the toy pipeline with one step replaced by bench.fault_models.Hangs
(a deadlock at init, on an item or in flush, or calls that compute for
several times --stall-s), a short --stall-s, and end as
a user would see them: exit 1, reason `stalled`, one sentence naming the
step, replica and item, every process's Python stacks under stacks/, and
every item the final step finished in timings.parquet.  The bound is S +
2 s from the hang (the time the fault model prints) to the job's end, which
is when the watch saw the stall (taking the stacks comes after).  Other
bounds are hang guards.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from models.toy import SleepingDevice
from rnb import cli
from rnb.analysis import rnb_analyze
from rnb.core.progress import ClientCells, ClientWait, Progress, ProgressSnapshot, empty_cells, empty_client_cells
from rnb.core.records import ProcessRecord
from rnb.engines.job import JobBook
from rnb.engines.stall import JobWatch, Stall, describe

REPO = Path(__file__).resolve().parents[2]
STALL_S = 3.0
SLOW_STALL_S = 1.5    # for the slow steps (their calls compute for 3 x this) and the flushes that spin (this long)
HANG_GUARD_S = 20.0   # from the stall's end to the main process's return: a hang guard, not a timing


def toy(tmp_path: Path, step: int, *, final_out: bool = False, step0_slots: int | None = None, **hang: Any) -> str:
    """config/toy.json with step `step` (0 or 1) wrapped in Hangs(**hang); optionally a third, pass-through step,
    or another number of step 0's output slots."""
    document = json.loads((REPO / "config" / "toy.json").read_text())
    if step0_slots is not None:
        document["pipeline"][0]["num_shared_tensors"] = step0_slots
    if final_out:  # step 1 hands its input on unchanged to a final TinyConvNet
        document["pipeline"][1] = {"model": "models.toy.AsyncSleep", "num_shared_tensors": 10,
                                   "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]}
        document["pipeline"].append({"model": "models.toy.TinyConvNet", "classes": 10,
                                     "queue_groups": [{"gpus": [-1], "in_queue": 0}]})
    wrapped = document["pipeline"][step]
    model = wrapped.pop("model")
    wrapped.update(model="bench.fault_models.Hangs", inner=model, **hang)
    path = tmp_path / "hangs.json"
    path.write_text(json.dumps(document))
    return str(path)


def run(tmp_path: Path, config: str, *args: str) -> tuple[int, float]:
    code = cli.main(["-c", config, "--log-dir", str(tmp_path / "logs"), "--warmup", "0", *args])
    return code, time.time()


def hung_at(output: str) -> float:
    """When the fault model began to hang (it says so on stderr)."""
    (when,) = re.findall(r"fault: .* hangs \(\w+\) at ([\d.]+)", output)
    return float(when)


# k = 3 stays in the quick lane: one real stall, end to end; the others are fault jobs, marked slow.
@pytest.mark.parametrize("k", [pytest.param(0, marks=pytest.mark.slow), 3, pytest.param(25, marks=pytest.mark.slow)])
def test_a_final_step_that_hangs_after_k_items_leaves_exactly_k_rows(tmp_path, capfd, job_log, k):
    code, returned = run(tmp_path, toy(tmp_path, 1, at_item=k), "-v", "200", "-mi", "2", "--stall-s", str(STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert code == 1, said.err
    assert [row["item_id"] for row in log.rows] == list(range(k)) and meta["finished_items"] == k
    assert meta["counted_items"] == k
    assert (meta["termination_reason"], meta["failed_process"]) == ("stalled", "step1-g0-r0")
    stacks = log.dir / "stacks"
    assert meta["error"].startswith(f"step 1 replica 0 (pid {log.meta['processes'][2]['pid']}, cpu) has held item {k} "
                                    "for ")
    # Its lock takes no CPU and a toy item next to none: the runner never computed; step 0 filled its 10 slots.
    assert re.fullmatch(r"[\d.]+ s with no item finished since and 10 items in its input queue, and its process has not "
                        r"computed since the job started; the Python stacks of every process are in "
                        rf"{re.escape(str(stacks))}/ \(step1-g0-r0\.txt is its own\)",
                        meta["error"].split(f"has held item {k} for ", 1)[1]), meta["error"]
    assert f"benchmark.py: {meta['error']}\n" in said.err and "Traceback" not in said.err
    assert meta["end_time"] - hung_at(said.err) <= STALL_S + 2.0   # the bound, from before the last progress
    assert returned - meta["end_time"] < HANG_GUARD_S
    assert log.children_left == []


@pytest.mark.slow
def test_a_stall_names_the_middle_step_and_keeps_every_process_stacks(tmp_path, capfd, job_log):
    code, _ = run(tmp_path, toy(tmp_path, 1, final_out=True, at_item=6, how="sleep"), "-v", "100", "-mi", "2",
                  "--stall-s", str(STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert code == 1, said.err
    assert meta["error"].startswith("step 1 replica 0 (pid ") and " has held item 6 for " in meta["error"]
    assert len(log.rows) == meta["counted_items"] == 6
    records = {p["name"]: p for p in meta["processes"]}
    runners = [name for name in records if name != "client"]  # the client may have sent all and left: no stacks then
    assert {name: records[name]["stacks"] for name in runners} == {name: f"stacks/{name}.txt" for name in runners}
    own = (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    assert 'bench/fault_models.py", line' in own and "in hang" in own and "in handle" in own
    assert records["step1-g0-r0"]["status"] == "killed"  # the stalled one; the others left on their own
    assert {records[name]["status"] for name in ("client", "step0-g0-r0", "step2-g0-r0")} == {"ok"}
    assert rnb_analyze.main([str(tmp_path / "logs")]) == 0
    report = capfd.readouterr().out
    assert " stalled " in report.splitlines()[2] and meta["error"] in report
    assert f"Python stacks of step1-g0-r0: {log.dir / 'stacks' / 'step1-g0-r0.txt'}, beside those of " in report


@pytest.mark.slow
def test_a_model_that_hangs_while_loading_ends_start_up_as_stalled(tmp_path, capfd, job_log):
    code, _ = run(tmp_path, toy(tmp_path, 0, at_init=True), "-v", "50", "-mi", "0", "--stall-s", str(STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    assert code == 1, said.err
    meta = log.meta
    assert (meta["termination_reason"], meta["start_time"], log.rows) == ("stalled", None, [])
    assert re.fullmatch(r"step 0 replica 0 \(pid \d+, cpu\) has not become ready [\d.]+ s after start-up began, and "
                        r"no process starting has used any CPU for [\d.]+ s; the Python stacks of every process are in "
                        r".*/stacks/ \(step0-g0-r0.txt is its own\)", meta["error"]), meta["error"]
    assert "in __init__" in (log.dir / "stacks" / "step0-g0-r0.txt").read_text()
    assert log.children_left == []


@pytest.mark.slow
def test_a_batching_step_that_hangs_in_flush_is_a_stall_too(tmp_path, capfd, job_log):
    # Gaps of 200 ms on average leave step 1's input idle (and its flush asked for) after its first items.
    code, _ = run(tmp_path, toy(tmp_path, 1, in_flush=True, how="spin"), "-v", "50", "-mi", "200", "--stall-s",
                  str(SLOW_STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    assert code == 1, said.err
    assert log.meta["termination_reason"] == "stalled" and "in flush" in (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    # Step 0 holds an item too, only because step 1 stopped taking them: the stall is put on step 1, whose flush
    # spins past 5 times the slowest call it completed (and past --stall-s).
    assert re.match(r"step 1 replica 0 \(pid \d+, cpu\) has been inside its model for [\d.]+ s with no item finished "
                    r"since( and \d+ items in its input queue)?, inside one call for [\d.]+ s, over 5 times the slowest "
                    r"its step completed \(0\.\d\d s\) \(a step only this slow needs a larger --stall-s\);",
                    log.meta["error"]), log.meta["error"]
    assert len(log.rows) == log.meta["counted_items"]


@pytest.mark.slow
def test_a_step_that_hangs_in_flush_with_its_items_all_queued_before_it_is_a_stall(tmp_path, capfd, job_log):
    """Step 0 has a slot for every item, so it hands them all on and holds none: they wait in step 1's queue."""
    code, _ = run(tmp_path, toy(tmp_path, 1, step0_slots=40, in_flush=True, how="spin"), "-v", "30", "-mi", "20",
                  "--stall-s", str(SLOW_STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    assert code == 1, said.err
    assert (log.meta["termination_reason"], log.meta["failed_process"]) == ("stalled", "step1-g0-r0")
    assert "in flush" in (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    waiting = 30 - len(log.rows)
    assert re.match(r"step 1 replica 0 \(pid \d+, cpu\) has been inside its model for [\d.]+ s with no item finished "
                    f"since and {waiting} items in its input queue, inside one call for [\\d.]+ s, over 5 times the "
                    r"slowest its step completed \(0\.\d\d s\) \(a step only this slow needs a larger --stall-s\);",
                    log.meta["error"]), log.meta["error"]
    assert len(log.rows) == log.meta["counted_items"] < 30
    assert log.children_left == []


@pytest.mark.slow
def test_a_step_whose_every_call_computes_for_3_times_stall_s_is_working_and_finishes(tmp_path, capfd, job_log):
    busy_s = 3 * SLOW_STALL_S
    code, _ = run(tmp_path, toy(tmp_path, 1, busy_s=busy_s), "-v", "2", "-mi", "0", "--stall-s", str(SLOW_STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    assert code == 0, said.err
    assert (log.meta["termination_reason"], log.meta["error"]) == ("target reached", None)
    assert [row["item_id"] for row in log.rows] == [0, 1]   # its first call, and one after a completed call
    assert all(row["inference1_finish"] - row["inference1_start"] >= busy_s for row in log.rows)


@pytest.mark.slow
def test_a_step_that_computes_long_then_hangs_is_caught_at_the_hang(tmp_path, capfd, job_log):
    """Item 0 computes for 3 x S; item 1 computes as long, then sleeps for ever."""
    code, _ = run(tmp_path, toy(tmp_path, 1, busy_s=3 * SLOW_STALL_S, at_item=1, how="sleep"), "-v", "5", "-mi", "0",
                  "--stall-s", str(SLOW_STALL_S))
    said = capfd.readouterr()
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert code == 1, said.err
    assert (meta["termination_reason"], meta["failed_process"]) == ("stalled", "step1-g0-r0")
    assert [row["item_id"] for row in log.rows] == [0]
    idle = re.match(r"step 1 replica 0 \(pid \d+, cpu\) has held item 1 for [\d.]+ s with no item finished since"
                    r"( and \d items in its input queue)?, and its "
                    r"process has not computed for (\d+\.\d) s;", meta["error"])
    assert idle and SLOW_STALL_S <= float(idle[2]) <= SLOW_STALL_S + 2.0, meta["error"]  # caught at the hang, in time
    assert meta["end_time"] - hung_at(said.err) <= SLOW_STALL_S + 2.0
    assert "in hang" in (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    assert log.children_left == []


@pytest.mark.slow
def test_stall_s_0_turns_the_watch_off_and_max_duration_still_ends_the_job(tmp_path, capfd, job_log):
    code, _ = run(tmp_path, toy(tmp_path, 1, at_item=2), "-v", "100", "-mi", "2", "--stall-s", "0",
                  "--max-duration", "2")
    log = job_log(tmp_path / "logs")
    assert code == 0, capfd.readouterr().err
    assert (log.meta["termination_reason"], log.meta["error"], len(log.rows)) == ("max duration", None, 2)


@pytest.mark.slow
def test_max_duration_ends_a_run_at_its_measured_seconds_keeping_all_it_measured(tmp_path, capsys, job_log):
    config = str(REPO / "config" / "toy.json")
    # 3 s at 200 items/s: about 600 items, enough that analysis can bound the p99 (368 after warm-up) and call it VALID
    code, _ = run(tmp_path, config, "-v", "1000000", "-mi", "5", "--max-duration", "3")
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert code == 0
    assert meta["termination_reason"] == "max duration" and 3.0 <= meta["elapsed_s"] < 3.5
    assert len(log.rows) == meta["finished_items"] == meta["counted_items"] > 0
    assert [row["item_id"] for row in log.rows] == list(range(len(log.rows)))
    capsys.readouterr()
    assert rnb_analyze.main([str(tmp_path / "logs"), "--min-items", "1", "--min-duration", "1"]) == 0
    assert " max duration  VALID " in capsys.readouterr().out


@pytest.mark.parametrize("argv, sentence", [
    (["--stall-s", "-1"], "command line: --stall-s: expected a number >= 0, found -1"),
    (["--max-duration", "nan"], "command line: --max-duration: expected a number >= 0, found nan"),
])
def test_bad_stall_or_duration_flags_are_one_sentence_and_exit_2(tmp_path, capsys, argv, sentence):
    assert cli.main(["-c", str(REPO / "config" / "toy.json"), "--check", *argv]) == 2
    assert capsys.readouterr().err.strip() == sentence


def test_bad_stall_or_duration_run_keys_are_one_sentence_and_exit_2(tmp_path, capsys):
    document = json.loads((REPO / "config" / "toy.json").read_text())
    document["run"] = {"stall_s": "soon"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    assert cli.main(["-c", str(path), "--check"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"{path}: run.stall_s: expected a number") and "\n" not in said


# The watch itself, with injected times: no job, no sleeping.

def book(*records: ProcessRecord) -> JobBook:
    jobs = JobBook()
    for record in records:
        jobs.add(record)
    return jobs


RUNNERS = book(ProcessRecord("client", "client", pid=10),
               ProcessRecord("step0-g0-r0", "runner", 0, 0, 0, "cpu", pid=11),
               ProcessRecord("step1-g0-r0", "runner", 1, 0, 0, "cuda:0", pid=12),
               ProcessRecord("step1-g1-r2", "runner", 1, 1, 2, "cpu", pid=13))


def snapshot(left: int, item: int | None = None, since: float | None = None) -> ProgressSnapshot:
    return ProgressSnapshot(left, item, since)


def test_the_watch_blames_the_oldest_held_item_once_no_item_left_any_step_for_stall_s():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(100.0)
    moving = {"step0-g0-r0": snapshot(5, 6, 101.0), "step1-g0-r0": snapshot(4, 5, 101.5), "step1-g1-r2": snapshot(0)}
    assert watch.running(moving, dict, RUNNERS, 102.0) is None
    still = {**moving, "step0-g0-r0": snapshot(9, 10, 102.5)}  # step 0 moved at 102.5; nothing since
    assert watch.running(still, dict, RUNNERS, 103.0) is None
    assert watch.running(still, dict, RUNNERS, 112.4) is None
    stall = watch.running(still, dict, RUNNERS, 113.0)
    assert stall is not None and stall.process == "step1-g0-r0"
    assert stall.sentence == ("step 1 group 0 replica 0 (pid 12, cuda:0) has held item 5 for 11.5 s with no item finished "
                              "since (a step only this slow needs a larger --stall-s)")


def test_the_stall_is_put_on_the_runner_inside_its_model_not_on_those_waiting_for_it_to_take_their_items():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    blocked = {"step0-g0-r0": ProgressSnapshot(20, 21, 1.0, None),      # holds item 21, waiting for a free slot
               "step1-g0-r0": ProgressSnapshot(12, None, None, 2.0)}    # in its model's flush since 2.0
    demand = {"step0-g0-r0": 4.0, "step1-g0-r0": 7.0}
    assert watch.running(blocked, lambda: demand, RUNNERS, 2.5) is None   # the last item left just before
    stall = watch.running(blocked, lambda: {**demand, "step1-g0-r0": 7.1}, RUNNERS, 13.0)   # 0.1 s in 10.5 s: idle
    assert stall is not None and stall.process == "step1-g0-r0"
    assert stall.sentence == ("step 1 group 0 replica 0 (pid 12, cuda:0) has been inside its model for 11.0 s with no item "
                              "finished since, and its process has not computed since the job started")


def test_items_waiting_in_a_queue_that_no_runner_takes_are_a_stall_though_no_runner_holds_one():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    idle = {"step0-g0-r0": snapshot(8), "step1-g0-r0": snapshot(3), "step1-g1-r2": snapshot(2)}
    assert watch.running(idle, dict, RUNNERS, 1.0, {0: 0, 1: 0}) is None   # nothing waits: quiet, however long
    assert watch.running(idle, dict, RUNNERS, 30.0, {0: 0, 1: 0}) is None
    assert watch.running(idle, dict, RUNNERS, 39.9, {0: 0, 1: 3}) is None
    stall = watch.running(idle, dict, RUNNERS, 40.0, {0: 0, 1: 3})
    assert stall is not None and stall.process == "step1-g0-r0"
    assert stall.sentence == ("3 items have waited in step 1's input queue with no item finished and no runner of step 1 "
                              "taking one, step 1 group 0 replica 0 (pid 12, cuda:0) among them")


def calling(left: int, item: int | None, since: float | None, calling_since: float,
            slowest_call_s: float | None = None) -> ProgressSnapshot:
    return ProgressSnapshot(left, item, since, calling_since, slowest_call_s)


def test_a_runner_whose_threads_compute_inside_its_first_call_is_working_however_long_the_call():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    busy = {"step0-g0-r0": snapshot(3, 3, 1.0), "step1-g0-r0": calling(2, 2, 1.0, 1.0)}
    for second in range(1, 600):   # its threads run or wait to run 0.8 s a second: computing, on a loaded machine
        assert watch.running(busy, lambda: {"step1-g0-r0": 0.8 * second}, RUNNERS, float(second)) is None
    # It stops asking for the CPU (a lock, a sleep, a device that never finishes): stalled stall_s later, not before.
    stopped = {"step1-g0-r0": 0.8 * 599 + 0.1}
    assert watch.running(busy, lambda: stopped, RUNNERS, 608.9) is None
    stall = watch.running(busy, lambda: stopped, RUNNERS, 609.0)
    assert stall is not None and stall.process == "step1-g0-r0"
    assert stall.sentence == ("step 1 group 0 replica 0 (pid 12, cuda:0) has held item 2 for 608.0 s with no item "
                              "finished since, and its process has not computed for 10.0 s")


def test_a_call_that_ends_is_progress_though_its_item_has_not_left_yet():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    inside = {"step1-g0-r0": calling(2, 2, 1.0, 1.0)}
    for second in range(1, 30):
        assert watch.running(inside, lambda: {"step1-g0-r0": 0.9 * second}, RUNNERS, float(second)) is None
    back = {"step1-g0-r0": ProgressSnapshot(2, 2, 1.0, None, 29.0, 1)}   # the call returned; its item not passed on yet
    assert watch.running(back, lambda: {"step1-g0-r0": 26.1}, RUNNERS, 30.0) is None
    assert watch.running(back, lambda: {"step1-g0-r0": 26.1}, RUNNERS, 39.9) is None
    stall = watch.running(back, lambda: {"step1-g0-r0": 26.1}, RUNNERS, 40.0)   # stuck passing it on
    assert stall is not None and stall.sentence.endswith("has held item 2 for 39.0 s with no item finished since (a step "
                                                         "only this slow needs a larger --stall-s)")


def test_a_call_using_cpu_is_bounded_by_5_times_the_slowest_its_step_completed_and_never_less_than_stall_s():
    # step 1 has two replicas: the one calling completed calls of at most 1 s; the other, in group 1, one of 4 s
    spinning = {"step1-g0-r0": calling(5, 5, 100.0, 100.0, 1.0), "step1-g1-r2": snapshot(7)}
    slowest = {**spinning, "step1-g1-r2": ProgressSnapshot(7, None, None, None, 4.0)}
    for progress, bound_s in ((spinning, 10.0), (slowest, 20.0)):   # max(10, 5 x 1 s), then 5 x 4 s
        watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
        watch.started(100.0)
        for second in range(100, 100 + int(bound_s)):   # a thread computing all along
            assert watch.running(progress, lambda: {"step1-g0-r0": float(second)}, RUNNERS, float(second)) is None
        stall = watch.running(progress, lambda: {"step1-g0-r0": 100.0 + bound_s}, RUNNERS, 100.0 + bound_s)
        assert stall is not None and stall.sentence == (
            f"step 1 group 0 replica 0 (pid 12, cuda:0) has held item 5 for {bound_s:.1f} s with no item finished "
            f"since, inside one call for {bound_s:.1f} s, over 5 times the slowest its step completed "
            f"({bound_s / 5 if bound_s > 10 else 1.0:.2f} s) (a step only this slow needs a larger --stall-s)")


def test_progress_keeps_the_slowest_call_that_did_work_not_an_idle_flush():
    progress = Progress(empty_cells())
    assert progress.read().slowest_call_s is None
    progress.took(0, 10.0)
    progress.calling(10.0)
    progress.called(12.5)
    progress.calling(13.0)
    progress.called(14.0)
    progress.calling(20.0)   # a flush that handed nothing on, asked long after
    progress.called(None)
    assert progress.read() == ProgressSnapshot(0, 0, 10.0, None, 2.5, 2)
    progress.calling(30.0)
    progress.called(33.0)
    progress.passed(1)
    assert progress.read() == ProgressSnapshot(1, None, None, None, 3.0, 3)


def test_a_runner_that_blips_between_idle_waits_is_not_computing():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    hung = {"step0-g0-r0": snapshot(3, 3, 1.0), "step1-g0-r0": calling(2, 2, 1.0, 1.0)}
    demand = {"step0-g0-r0": 0.0, "step1-g0-r0": 0.0}
    # Step 0 waits for a free slot, waking 20 times a second: on a loaded machine its wake-ups wait to run, three
    # quarter seconds in eight demanding 25 % of the time, the others 1 %.
    for quarter in range(4, 44):
        demand["step0-g0-r0"] += 0.0625 if quarter % 8 in (1, 2, 3) else 0.0025
        assert watch.running(hung, lambda: demand, RUNNERS, quarter / 4) is None
    stall = watch.running(hung, lambda: demand, RUNNERS, 11.0)
    assert stall is not None and stall.process == "step1-g0-r0"


def test_waiting_for_the_cpu_stand_in_device_sleeps_to_its_mark_and_leaves_the_thread_idle():
    device = SleepingDevice()
    written: list[int] = []
    device.submit(1.0, lambda: written.append(1))
    done = device.mark()
    assert not done.query() and written == []   # not reached: its effect is not applied yet
    cpu = time.thread_time()
    done.wait()
    cpu = time.thread_time() - cpu
    assert done.query() and written == [1]
    assert cpu < 0.3   # a spinning wait would use about the whole second


def test_a_quiet_pipeline_holding_nothing_never_stalls_and_a_new_hold_starts_its_own_clock():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(0.0)
    idle = {"step0-g0-r0": snapshot(3), "step1-g0-r0": snapshot(3)}
    assert watch.running(idle, dict, RUNNERS, 500.0) is None   # Poisson gaps longer than S are no stall
    held = {"step0-g0-r0": snapshot(3, 3, 505.0), "step1-g0-r0": snapshot(3)}
    assert watch.running(held, dict, RUNNERS, 514.0) is None
    assert watch.running(held, dict, RUNNERS, 515.5) is not None


def test_start_up_stalls_only_when_no_process_became_ready_and_none_starting_used_cpu():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    jobs = book(*RUNNERS.records)
    jobs.ready.update({"client", "step1-g0-r0"})
    assert watch.start_up(jobs, {"step0-g0-r0": 1.0, "step1-g1-r2": 2.0}, 5.0) is None
    assert watch.start_up(jobs, {"step0-g0-r0": 1.5, "step1-g1-r2": 2.0}, 14.0) is None   # still importing: CPU
    assert watch.start_up(jobs, {"step0-g0-r0": 1.5, "step1-g1-r2": 2.0}, 23.0) is None
    stall = watch.start_up(jobs, {"step0-g0-r0": 1.5, "step1-g1-r2": 2.0}, 24.5)
    assert stall is not None and stall.process == "step0-g0-r0"
    assert stall.sentence == ("step 0 replica 0 (pid 11, cpu) has not become ready 24.5 s after start-up began (nor have "
                              "1 other processes), and no process starting has used any CPU for 10.5 s")


def test_the_maximum_duration_counts_from_the_start_barrier_and_none_means_no_bound():
    watch = JobWatch(stall_s=0, max_duration_s=30.0, now=0.0)
    assert watch.deadline() is None and not watch.over_time(1e9)   # not started yet
    watch.started(50.0)
    assert (watch.deadline(), watch.over_time(79.9), watch.over_time(80.0)) == (80.0, False, True)
    unbounded = JobWatch(stall_s=0, max_duration_s=0, now=0.0)
    unbounded.started(0.0)
    assert unbounded.deadline() is None and unbounded.running({"step0-g0-r0": snapshot(0, 1, 0.0)}, dict, RUNNERS, 1e9) is None


def test_a_process_is_described_as_a_user_finds_it():
    ray_runner = ProcessRecord("step0-g0-r1", "runner", 0, 0, 1, "cpu", pid=7, node_ip="10.0.0.2")
    jobs = book(ray_runner, ProcessRecord("step0-g0-r0", "runner", 0, 0, 0, "cpu"))
    assert describe(ray_runner, jobs) == "step 0 replica 1 (pid 7, on 10.0.0.2, cpu)"
    assert describe(ProcessRecord("client", "client", pid=3), jobs) == "the client (pid 3)"


@pytest.mark.slow
@pytest.mark.parametrize("ending, code, reason", [("sigterm", 143, "terminated"), ("sigint", 130, "interrupted"),
                                                  ("crash", 1, "process failed")])
def test_whatever_ends_a_job_whose_final_step_hangs_the_items_it_finished_are_all_in_the_log(tmp_path, capfd, job_log,
                                                                                            ending, code, reason):
    """The final step hangs on item 4, holding the cards of items 0-3; then a signal, or another process dies.

    A signal needs a main process of its own to receive it; the crash needs none, so it runs in this one.
    """
    config = toy(tmp_path, 1, at_item=4)
    argv = ["-c", config, "-v", "200", "-mi", "20", "--warmup", "0", "--stall-s", "600", "--log-dir",
            str(tmp_path / "logs")]
    if ending == "crash":  # step 0 dies a little later, while the final step hangs
        document = json.loads(Path(config).read_text())
        document["pipeline"][0]["exit_at_item"] = 7
        Path(config).write_text(json.dumps(document))
        returncode, err = cli.main(argv), ""
        assert "fault: " in capfd.readouterr().err   # the final step did hang first
    else:
        returncode, err = signalled(argv, signal.SIGTERM if ending == "sigterm" else signal.SIGINT)
    log = job_log(tmp_path / "logs")
    assert (returncode, log.meta["termination_reason"]) == (code, reason), err
    assert [row["item_id"] for row in log.rows] == [0, 1, 2, 3] and log.meta["counted_items"] == 4


def signalled(argv: list[str], stop: signal.Signals) -> tuple[int, str]:
    """benchmark.py run with `argv`, sent `stop` 0.5 s after its fault model began to hang (ten times the 50 ms within
    which the final step ships the cards it holds): its exit code and stderr."""
    job = subprocess.Popen([sys.executable, "benchmark.py", *argv], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert job.stderr is not None
    for line in job.stderr:
        if line.startswith("fault: "):
            break
    time.sleep(0.5)
    job.send_signal(stop)
    try:
        _, err = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail("the job hung")
    return job.returncode, err


def blamed(stall: Stall | None, process: str) -> str:
    """The sentence of a stall put on `process`."""
    assert stall is not None and stall.process == process, stall
    return stall.sentence


def test_a_step_whose_every_runner_is_stuck_ends_the_job_stall_s_after_its_calls_began_though_another_still_moves():
    """The final step's only runner sits in one call from 100 s on, computing nothing, with an item: step 0 still hands
    items on each second (into its queue), which used to put the stall off until step 0 stopped too."""
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(90.0)
    runners = book(*(r for r in RUNNERS.records if r.name != "step1-g1-r2"))
    flat = {"step1-g0-r0": 1.0}   # its threads ran 1 s in all, before the call
    for second in range(100, 110):
        moving = {"step0-g0-r0": snapshot(second, second + 1, float(second)), "step1-g0-r0": calling(4, 5, 100.0, 100.0)}
        assert watch.running(moving, lambda: flat, runners, float(second) + 0.5, {1: second - 99}) is None
    assert blamed(watch.running(moving, lambda: flat, runners, 110.0, {1: 10}), "step1-g0-r0") == (
        "step 1 replica 0 (pid 12, cuda:0) has held item 5 for 10.0 s with no item finished since and 10 items in its "
        "input queue, and its process has not computed since the job started")


def test_a_quiet_pipeline_whose_client_has_nothing_to_send_for_stall_s_has_stalled_saying_when_the_next_is_due():
    watch = JobWatch(stall_s=10.0, max_duration_s=0, now=0.0)
    watch.started(1000.0)
    held = {"step0-g0-r0": snapshot(4, 4, 1040.0), "step1-g0-r0": snapshot(3)}
    quiet = {"step0-g0-r0": snapshot(5), "step1-g0-r0": snapshot(5)}
    waiting = ClientWait(since=1041.0, due=1000.0 + 86_000.0, item=5)   # the trace's next offset, a day on
    assert watch.running(held, dict, RUNNERS, 1045.0, client=waiting) is None   # item 4 still in the pipeline
    assert watch.running(quiet, dict, RUNNERS, 1046.0, client=waiting) is None
    assert watch.running(quiet, dict, RUNNERS, 1055.9, client=waiting) is None   # quiet since 1046: not yet S
    assert watch.running(quiet, dict, RUNNERS, 1_000_000.0, client=None) is None   # sending, or no due time at all
    assert blamed(watch.running(quiet, dict, RUNNERS, 1056.0, client=waiting), "client") == (
        "the client (pid 10) has had nothing to send for 15.0 s with every request sent so far finished: request 5 is "
        "due 86000.0 s after the start, 85944.0 s from now (a load this sparse needs a larger --stall-s)")


def test_the_client_cells_say_a_wait_whole_and_nothing_while_it_sends() -> None:
    cells = ClientCells(empty_client_cells())
    assert cells.read() is None
    cells.waiting(5.0, 9.0, 3)
    assert cells.read() == ClientWait(5.0, 9.0, 3)
    cells.sending()
    assert cells.read() is None
