"""No state of a job may hang, and every ending leaves a log: dead lock holders, signals, a killed main.

Jobs that a signal or the test stops, or that need a mount of their own, run
as `python benchmark.py` subprocesses, each carrying a mark in its
environment, so any process left behind (an orphan) is found by the mark
even after the main process is gone.  Jobs that end on their own (a child
that dies, a message that cannot be read) run in the test process, as in
tests/engines/test_stalls.py: they share its fork server instead of each importing
torch twice, and the job's own processes still running are found from its
log (`job_log`'s children_left).  Bounds are hang guards, not timings: each
is several times what the behaviour needs.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.fault_jobs import MARK, children, fork_server_of, isolation_works, marked, waiting_for_fork_server
from rnb import cli
from rnb.analysis import rnb_analyze
from tests.support.start_up_stops import stopped_at

REPO = Path(__file__).resolve().parents[2]
SLOW_IMPORTS = REPO / "tests" / "support" / "slow_imports"
# How long the fork server spends "importing torch" while the test kills the main process.  It starts as the main
# process does (rnb.launch), so this covers the main process's own start (2-3 s here) and the test's act after it.
IMPORT_DELAY_S = 10.0
# The same while Ctrl-C lands: the stop cuts the main process's wait for its fork server short.
INTERRUPTED_IMPORT_DELAY_S = 8.0


def write_config(tmp_path: Path, document: dict) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(document))
    return str(path)


def toy_config(tmp_path: Path) -> str:
    return write_config(tmp_path, json.loads((REPO / "config/toy.json").read_text()))


def start_job(tmp_path: Path, config: str, *argv: str, import_delay_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    if import_delay_s:
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(SLOW_IMPORTS), env.get("PYTHONPATH")])),
                   RNB_TEST_IMPORT_DELAY_S=str(import_delay_s))
    command = [sys.executable, "benchmark.py", "-c", config, "--log-dir", str(tmp_path / "logs"), *argv]
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    return job, mark


def wait_for_the_fork_server_to_be_waited_for(job: subprocess.Popen, logs: Path, timeout_s: float = 60.0) -> None:
    """Until the job's main process is at its first child while its fork server is still importing torch, slowly:
    no child is forked before it has."""
    deadline = time.time() + timeout_s
    while not waiting_for_fork_server(job.pid, logs):
        assert time.time() < deadline and job.poll() is None, "the job never reached its first child"
        time.sleep(0.05)
    server = fork_server_of(job.pid)
    assert server is not None and children(server) == [], "a child was forked already"


def finish(job: subprocess.Popen, timeout_s: float = 120.0) -> tuple[str, str]:
    try:
        return job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail(f"the job hung: still running {timeout_s:g} s on")


@pytest.mark.slow
@pytest.mark.parametrize("hold", ["flag", "status", "results"])
def test_a_child_killed_holding_shared_plumbing_cannot_wedge_the_job(tmp_path, capfd, job_log, hold):
    """The dead child held the flag mid-raise, the status queue's write lock, or had written half a message."""
    config = write_config(tmp_path, {"source": {"synthetic": True}, "pipeline": [  # one step, two replicas
        {"model": "bench.fault_models.DiesHolding", "queue_groups": [{"gpus": [-1, -1]}], "hold": hold, "at_item": 3}]})
    code = cli.main(["-c", config, "-v", "200", "-mi", "2", "--warmup", "0", "--log-dir", str(tmp_path / "logs")])
    err = capfd.readouterr().err
    assert code == 1, err
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    dead = meta["failed_process"]  # whichever of the two replicas took item 3
    assert (meta["termination_reason"], dead in ("step0-g0-r0", "step0-g0-r1")) == ("process failed", True)
    assert meta["error"] == f"process {dead} failed: was killed by signal 9"
    assert "Traceback" not in err and len(rows) == meta["finished_items"] < 200
    assert log.children_left == []


@pytest.mark.slow
@pytest.mark.parametrize("target", ["main", "group"])
def test_sigterm_stops_the_job_like_ctrl_c_with_exit_143_and_a_log(tmp_path, target, job_log):
    # -q: no start-up lines, so stderr's first line is the start.
    job, mark = start_job(tmp_path, toy_config(tmp_path), "-v", "100000", "-mi", "20", "--warmup", "0", "-q")
    assert job.stderr.readline().startswith("benchmark.py: started "), "the job never started"
    time.sleep(0.5)  # some items finish (one every 20 ms)
    (os.kill if target == "main" else os.killpg)(job.pid, signal.SIGTERM)
    out, err = finish(job)
    assert job.returncode == 143, err
    _, meta, rows = job_log(tmp_path / "logs")
    assert (meta["termination_reason"], meta["error"]) == ("terminated", None)
    assert len(rows) == meta["finished_items"] > 0 and [row["item_id"] for row in rows] == list(range(len(rows)))
    assert {process["status"] for process in meta["processes"]} == {"ok"}  # children left on their own
    assert meta["main_peak_rss_bytes"] > 0
    assert "termination: terminated" in out and "Traceback" not in err
    assert marked(mark) == []


def test_ctrl_c_to_the_process_group_during_start_up_prints_no_traceback(tmp_path, job_log):
    job, mark = start_job(tmp_path, toy_config(tmp_path), "-v", "50", "-mi", "0",
                          import_delay_s=INTERRUPTED_IMPORT_DELAY_S)
    wait_for_the_fork_server_to_be_waited_for(job, tmp_path / "logs")
    os.killpg(job.pid, signal.SIGINT)
    out, err = finish(job)
    assert job.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    _, meta, rows = job_log(tmp_path / "logs")
    assert (meta["termination_reason"], meta["start_time"], rows) == ("interrupted", None, [])
    assert marked(mark) == []


def test_children_of_a_killed_main_exit_at_once_even_while_importing(tmp_path, capsys):
    job, mark = start_job(tmp_path, toy_config(tmp_path), "-v", "50", "-mi", "0", import_delay_s=IMPORT_DELAY_S)
    wait_for_the_fork_server_to_be_waited_for(job, tmp_path / "logs")
    job.kill()
    killed = time.time()
    finish(job)
    while marked(mark) and time.time() - killed < IMPORT_DELAY_S:
        time.sleep(0.05)
    assert marked(mark) == [] and time.time() - killed < IMPORT_DELAY_S / 2
    # The killed job's directory holds no meta.json: analysis lists it as incomplete and goes on.
    (job_dir,) = (tmp_path / "logs").iterdir()
    assert rnb_analyze.main([str(tmp_path / "logs")]) == 0
    assert capsys.readouterr().out.startswith(f"{job_dir.name}: INCOMPLETE: no meta.json")


@pytest.mark.slow
@pytest.mark.skipif(not isolation_works(), reason="needs a mount namespace of its own (unshare) to mount a small tmpfs")
@pytest.mark.parametrize("room, file", [("128k", r"timings\.spool/part-\d+\.parquet"), ("full", r"config\.json")],
                         ids=["fills_mid_run", "full_at_start"])
def test_a_log_directory_that_fills_up_ends_the_job_with_exit_1_and_one_sentence_naming_the_file(tmp_path, capsys,
                                                                                                room, file):
    """--log-dir is a small tmpfs of the test's own: it fills while the job runs, or is full before it starts."""
    logs, kept = tmp_path / "logs", tmp_path / "kept"
    logs.mkdir()
    fill = f"dd if=/dev/zero of={logs}/filler bs=4k count=16 2>/dev/null; " if room == "full" else ""
    size = "64k" if room == "full" else room
    script = (f"mount -t tmpfs -o size={size} tmpfs {logs} && {fill}"
              f"{sys.executable} benchmark.py -c config/toy.json -mi 0 -v 30000 --log-dir {logs}; code=$?; "
              f"cp -r {logs} {kept}; exit $code")
    mark = uuid.uuid4().hex
    job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                           env={**os.environ, MARK: mark}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    out, err = finish(job)
    assert job.returncode == 1, err
    errors = [line for line in err.splitlines() if "could not write" in line]
    assert len(errors) == 1 and re.fullmatch(rf"benchmark\.py: could not write {logs}/\S+/{file} \(No space left on "
                                              r"device\): the log directory is full or failing(, so the job did not "
                                              r"start)?", errors[0]), err
    assert "Traceback" not in err and marked(mark) == []
    if room != "full":  # it ran: stopped in order, what it measured counted
        (meta_path,) = kept.glob("*/meta.json")
        meta = json.loads(meta_path.read_text())
        assert meta["termination_reason"] == "log write failed" and {p["status"] for p in meta["processes"]} <= {"ok", "killed"}
        assert rnb_analyze.main([str(kept)]) == 0
        report = capsys.readouterr().out
        job_dir = meta_path.parent
        # How much of the tmpfs the spool had taken when it failed decides whether timings.parquet still fitted at
        # the end: the report says which the job left.
        if (job_dir / "timings.parquet").is_file():
            assert " log write failed " in report and "INCOMPLETE" not in report, report
            assert len(pq.read_table(job_dir / "timings.parquet")) == meta["finished_items"]
        else:
            spooled = sum(len(pq.read_table(part)) for part in (job_dir / "timings.spool").glob("part-*.parquet"))
            assert report == (f"{job_dir.name}: INCOMPLETE: its log directory refused timings.parquet; {spooled} "
                              f"finished items are in {job_dir / 'timings.spool'}\n"), report


def test_a_message_the_next_step_cannot_unpickle_ends_the_job_with_exit_1_and_one_sentence(tmp_path, capfd, job_log):
    """Step 0 passes on, in its non_tensors, an error whose class cannot be rebuilt from its pickle."""
    document = json.loads((REPO / "config/toy.json").read_text())
    document["pipeline"][0].update(model="tests.support.fixture_models.HandsOnItsError", error_at_item=3)
    code = cli.main(["-c", write_config(tmp_path, document), "-v", "50", "-mi", "20", "--warmup", "0", "--log-dir",
                     str(tmp_path / "logs")])
    err = capfd.readouterr().err
    assert code == 1, err
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    sentence = ("process step1-g0-r0 failed: UnreadableMessage: a message on the inter-step queue 0 (step 0 to step 1) "
                "could not be unpickled (TypeError: TwoPartError.__init__() missing 1 required positional argument: "
                "'why')")
    assert (meta["termination_reason"], meta["failed_process"], meta["error"]) == ("process failed", "step1-g0-r0",
                                                                                   sentence)
    assert err.count(sentence) == 1 and f"benchmark.py: {sentence}\n" in err and "Traceback" not in err
    assert [row["item_id"] for row in rows] == [0, 1, 2] == list(range(meta["finished_items"]))  # all before item 3
    assert log.children_left == []


@pytest.mark.slow
@pytest.mark.parametrize(("instant", "turn", "logged"), [("imports", 0, False), ("spawning", 1, True),
                                                         ("loading", 0, True)])
def test_a_stop_at_an_instant_of_start_up_ends_with_its_code_one_line_and_a_whole_log_or_none(tmp_path, instant, turn,
                                                                                            logged, job_log):
    run, code, reason = stopped_at(tmp_path, instant, turn)
    assert run.returncode == code and run.orphans == 0 and "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("benchmark.py: ")]
    if logged:
        _, meta, rows = job_log(tmp_path / "logs")
        assert (meta["termination_reason"], meta["start_time"], rows) == (reason, None, [])
        assert lines == [f"benchmark.py: {reason} (SIG{'TERM' if code == 143 else 'INT'}) after its log was opened: "
                         "the log keeps what it measured"]
    else:
        assert not (tmp_path / "logs").exists() or list((tmp_path / "logs").iterdir()) == []
        assert lines == [f"benchmark.py: {reason} (SIGINT) before the job started: nothing was written"]
