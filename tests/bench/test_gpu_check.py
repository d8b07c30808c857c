"""bench/gpu_check.py's own machinery, on the CPU: its configs, jobs in sessions of their own, isolated calls, lines.

The checks themselves need a GPU; this makes sure the run a GPU session
gets is not lost to a mistake that shows without one (tests/bench/test_gpu_rehearsal.py
runs the whole orchestration).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from bench import gpu_check, gpu_kit
from bench.bounded import Deadline, finish, isolated, start
from bench.common import Goal, Row, Side
from bench.gpu_job_checks import contexts_seen
from bench.gpu_kit import Check, GpuWatch, pipeline, run_job, verdict
from bench.gpu_rehearsal import StandInNvml
from bench.gpu_suite import rows_check, run_pytest
from rnb.pipeline.gpus import DeviceState


def _double(x: int) -> int:
    return 2 * x


def _fail() -> None:
    raise ValueError("on purpose")


def test_an_isolated_call_returns_its_value_or_its_error_as_one_line():
    assert isolated(_double, 21) == 42
    with pytest.raises(RuntimeError, match="^ValueError: on purpose$"):
        isolated(_fail)


def test_a_pipeline_puts_each_step_on_its_own_device():
    config = pipeline([("models.toy.SyntheticFrames", {"clips": 1}, 0), ("models.toy.TinyConvNet", {}, -1)],
                      {"dataset": "d"})
    assert config["source"] == {"dataset": "d"}
    assert [step["queue_groups"][0]["gpus"] for step in config["pipeline"]] == [[0], [-1]]
    assert config["pipeline"][0]["clips"] == 1 and config["pipeline"][1]["queue_groups"][0]["in_queue"] == 0


class _NvmlListingTwoContextsUnderOnePid(StandInNvml):
    """NVML as gVisor may answer: two CUDA contexts listed under one pid of another namespace."""

    def device(self, physical_index: int) -> DeviceState:
        return dataclasses.replace(super().device(physical_index), compute_pids=(90100, 90100))


def test_a_job_runs_in_a_process_of_its_own_and_names_its_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("rnb.pipeline.gpus.Nvml", _NvmlListingTwoContextsUnderOnePid)  # for the watcher, here only
    job = run_job(pipeline([("models.toy.SyntheticFrames", gpu_kit.TOY, -1), ("models.toy.TinyConvNet", {}, -1)]),
                  6, tmp_path, Deadline.after(240), watch_gpu=True)
    assert job.code == 0 and len(job.rows) == 6 and job.job_dir is not None and job.pid != os.getpid()
    assert set(job.pids()) == {"main", "client", "step0-g0-r0", "step1-g0-r0"}
    assert job.column("device1") == ["cpu"] * 6
    assert job.watch == GpuWatch(frozenset({90100}), 2)
    assert contexts_seen(job, {"main", "step0-g0-r0"}) == (
        True, "NVML listed at most 2 at once, under 1 pid(s) of another pid namespace")
    assert contexts_seen(job, {"step0-g0-r0"})[0] is False


def test_contexts_are_unknown_where_nvml_cannot_list_them():
    job = gpu_kit.Job(0, 1, "", {}, [], None, GpuWatch(error="RuntimeError: Not Supported"))
    assert contexts_seen(job, {"main"}) == (None, "unknown: NVML could not list the compute processes "
                                                  "(RuntimeError: Not Supported)")


def test_each_check_is_one_line_and_the_run_refuses_what_it_cannot_do(monkeypatch: pytest.MonkeyPatch, capsys):
    assert verdict("seam", True, "12 us/item").line() == "PASS  seam          12 us/item"
    assert Check("tests", "SKIP", "no time").line().startswith("SKIP  tests")
    monkeypatch.setenv(gpu_check.BUNDLED, "1")  # as if the bundle were unpacked: no re-run of itself
    assert gpu_check.main(["--only", "seam,warp"]) == 2
    assert "--only: expected names among seam, uuid, pinned, stage-times" in capsys.readouterr().err
    assert gpu_check.main(["--rehearse", "--deadline", "0"]) == 2
    assert capsys.readouterr().err == "bench/gpu_check.py: --deadline: expected a number of seconds > 0, found 0\n"
    if not torch.cuda.is_available():
        assert gpu_check.main(["--only", "seam"]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err


def test_pytest_that_passed_no_test_is_a_skip_not_a_pass(tmp_path: Path, capsys):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_none.py").write_text("import pytest\n\n@pytest.mark.skip(reason='no GPU')\ndef test_gpu():\n    pass\n")
    check = run_pytest(["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_none.py")],
                       Deadline.after(240))
    assert (check.name, check.status) == ("tests", "SKIP")
    assert check.figure.startswith("pytest passed no test (exit 0): 1 skipped in ")
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 skipped in ")


def test_p8_is_one_line_that_fails_when_a_row_did_not_run(capsys):
    ran = Row("P8", "harness / loop", Goal(">=", 0.95), Side.of("harness", "items/s", [9.7]),
              Side.of("loop", "items/s", [10.0]), 0.97, 0.97, 0.97, 1)
    check = rows_check([ran, Row("P8d", "loader alone", None, note="failed: the job exited 1")])
    assert (check.status, check.figure) == ("FAIL", "P8 0.97 (goal >= 0.95, met: True); P8d did not run")
    assert [row["id"] for row in check.seen["rows"]] == ["P8", "P8d"]
    assert rows_check([ran]).status == "PASS"
    assert "P8d" in capsys.readouterr().out  # the table is printed before the line


LEAVES_A_CHILD = "import subprocess; print(subprocess.Popen(['sleep', '600']).pid, flush=True)"


def test_a_child_that_ended_leaves_nothing_of_its_group_behind():
    child = start([sys.executable, "-c", LEAVES_A_CHILD])
    stdout, _ = finish(child, Deadline.after(120), 60.0, "a child leaving a sleeper")
    assert child.returncode == 0
    assert _gone_within(int(stdout), 10.0)  # the sleeper, left in the child's group, was killed with it


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` ended (or is a zombie no one reaped yet) within `seconds`."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
