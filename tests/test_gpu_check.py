"""bench/gpu_check.py's own machinery, on the CPU: its configs, jobs in processes of their own, isolated calls, lines.

The checks themselves need a GPU; this makes sure the run a GPU session
gets is not lost to a mistake that shows without one.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench import gpu_check
from bench.gpu_check import Check, isolated, pipeline, run_job, verdict


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


def test_a_job_runs_in_a_process_of_its_own_and_names_its_processes(tmp_path: Path):
    job = run_job(pipeline([("models.toy.SyntheticFrames", gpu_check.TOY, -1), ("models.toy.TinyConvNet", {}, -1)]),
                  6, tmp_path)
    assert job.code == 0 and len(job.rows) == 6 and job.job_dir is not None and job.pid != os.getpid()
    assert set(job.pids()) == {"main", "client", "step0-g0-r0", "step1-g0-r0"} and job.gpu_pids == frozenset()
    assert job.column("device1") == ["cpu"] * 6


def test_each_check_is_one_line_and_the_run_refuses_what_it_cannot_do(monkeypatch: pytest.MonkeyPatch, capsys):
    assert verdict("seam", True, "12 us/item").line() == "PASS  seam          12 us/item"
    assert Check("tests", "SKIP", "no time").line().startswith("SKIP  tests")
    monkeypatch.setenv(gpu_check.BUNDLED, "1")  # as if the bundle were unpacked: no re-run of itself
    assert gpu_check.main(["--only", "seam,warp"]) == 2
    assert "--only: expected names among seam, stage-times" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gpu_check.main(["--only", "seam"]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err
