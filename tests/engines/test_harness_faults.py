"""Jobs that go wrong: a model failing at init, at an item, dying by os._exit, and Ctrl-C.

Each must end promptly with its own exit code and reason, record who failed
and why, keep the finished items' timings, and leave no process behind.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rnb import cli
from rnb.analysis import rnb_analyze
from tests.support.shared_jobs import bulk_toy_job

# A hang guard only: stopping itself is measured against the moment the job ended.
STOP_BOUND_S = 10.0


def toy_with(tmp_path: Path, step: int, **faults) -> str:
    document = json.loads(Path("config/toy.json").read_text())
    document["pipeline"][step].update(faults)
    path = tmp_path / "faulty.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize("step, faults, failed, error", [
    (1, {"fail_at_init": True}, "step1-g0-r0",
     "RuntimeError: TinyConvNet failed at init on purpose (fail_at_init)"),
    (0, {"fail_at_item": 5}, "step0-g0-r0",
     "RuntimeError: SyntheticFrames failed on item 5 on purpose (fail_at_item)"),
    (1, {"exit_at_item": 5}, "step1-g0-r0", "exited with code 3"),
], ids=["init", "item", "os_exit"])
def test_a_failing_child_ends_the_job_with_exit_1_and_says_who_and_why(tmp_path, capsys, job_log, step, faults, failed,
                                                                      error):
    config = toy_with(tmp_path, step, **faults)
    code = cli.main(["-c", config, "-v", "50", "-mi", "0", "--log-dir", str(tmp_path / "logs")])
    returned = time.time()
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert code == 1
    assert (meta["termination_reason"], meta["failed_process"]) == ("process failed", failed)
    assert meta["error"] == f"process {failed} failed: {error}"
    terminal = capsys.readouterr()
    assert f"benchmark.py: process {failed} failed: {error}\n" in terminal.err
    assert (terminal.out + terminal.err).count(error) == 1
    assert rnb_analyze.main([str(tmp_path / "logs")]) == 0
    assert "".join(capsys.readouterr()).count(error) == 1
    assert returned - meta["end_time"] < STOP_BOUND_S
    statuses = {p["name"]: (p["status"], p["error"]) for p in meta["processes"]}
    assert statuses[failed] == ("failed", error)
    assert all(status in ("ok", "killed") for name, (status, _) in statuses.items() if name != failed)
    assert log.children_left == []
    assert len(rows) == meta["finished_items"] < 50
    if "fail_at_init" in faults:
        assert meta["start_time"] is None and rows == []
    else:
        assert 5 not in [row["item_id"] for row in rows]


@pytest.mark.slow
def test_a_full_request_queue_aborts_the_job_with_exit_1(tmp_path, capsys, job_log):
    # requests every 10 us on average: far more than the toy pipeline finishes, so 4 places fill at once
    code = cli.main(["-c", "config/toy.json", "-v", "2000", "-mi", "0.01", "-qs", "4", "--log-dir", str(tmp_path)])
    log = job_log(tmp_path)
    meta, rows = log.meta, log.rows
    assert code == 1
    assert meta["termination_reason"] == "request queue full" and meta["failed_process"] is None
    sentence = "the request queue was full (capacity 4, -qs): the pipeline could not keep up with the requests"
    assert meta["error"] == sentence and f"benchmark.py: {sentence}\n" in capsys.readouterr().err
    assert len(rows) == meta["finished_items"] < 2000
    assert log.children_left == []


def test_bulk_mode_makes_the_request_queue_hold_every_request(tmp_path_factory, job_log):
    """-mi 0 sends all -v requests at once: RnB sized the request queue for them, whatever -qs said.

    -qs 12 still holds the signals of the toy's 10 output slots between its steps.
    """
    shared = bulk_toy_job(tmp_path_factory.getbasetemp())   # -v 400 -mi 0 -qs 12
    log = job_log(shared.log_dir)
    assert shared.done.returncode == 0 and log.meta["termination_reason"] == "target reached" and len(log.rows) == 400
    assert (log.meta["args"]["queue_size"], log.meta["args"]["request_queue_size"]) == (12, 400)
    note = ("bulk mode (-mi 0): the request queue holds all 400 requests, more than -qs 12 (which still bounds "
            "the inter-step queues), as RnB sized it")
    assert note in log.meta["notes"] and f"benchmark.py: {note}\n" in shared.done.stderr
    assert log.meta["job_id"].endswith("-qs12")


@pytest.mark.slow
def test_ctrl_c_exits_130_and_keeps_the_finished_items(tmp_path, job_log):
    command = [sys.executable, "benchmark.py", "-c", "config/toy.json", "-mi", "20", "-v", "100000",
               "--warmup", "0", "--log-dir", str(tmp_path), "-q"]   # -q: stderr's first line is the start, not start-up's
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = job.stderr.readline()  # the main process announces the start gate opening
        assert started.startswith("benchmark.py: started "), started
        time.sleep(0.5)  # some items finish (one every 20 ms)
        job.send_signal(signal.SIGINT)
        interrupted = time.time()
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, err
    assert time.time() - interrupted < STOP_BOUND_S
    assert "Traceback" not in err
    log = job_log(tmp_path)
    meta, rows = log.meta, log.rows
    assert meta["termination_reason"] == "interrupted" and meta["failed_process"] is None
    assert len(rows) == meta["finished_items"] > 0
    assert [row["item_id"] for row in rows] == list(range(len(rows)))
    assert "termination: interrupted" in out
    assert log.children_left == []
