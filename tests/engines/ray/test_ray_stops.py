"""Ctrl-C and SIGTERM to the process group of a job on a Ray of its own, while Ray starts and while the actors are
created: the same endings as on the local engine, and nothing of that Ray left running.

In a module named test_ray_* so that it runs where the other Ray modules run, one Ray at a time on the host.
"""
from __future__ import annotations

import pytest

from tests.support.start_up_stops import stopped_at


@pytest.mark.slow
def test_sigterm_to_the_group_while_ray_starts_exits_143_with_one_line_and_nothing_written(tmp_path) -> None:
    run, code, _ = stopped_at(tmp_path, "ray-start", 1)
    assert (run.returncode, run.orphans, "Traceback" in run.stderr) == (143, 0, False)
    assert "benchmark.py: terminated (SIGTERM) before the job started: nothing was written" in run.stderr
    assert not (tmp_path / "logs").exists() or list((tmp_path / "logs").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("turn", [0, 1], ids=["sigint", "sigterm"])
def test_a_stop_to_the_group_while_the_actors_are_created_ends_the_job_with_its_log(tmp_path, turn, job_log) -> None:
    run, code, reason = stopped_at(tmp_path, "ray-actors", turn)
    assert (run.returncode, run.orphans, "Traceback" in run.stderr) == (code, 0, False)
    _, meta, rows = job_log(tmp_path / "logs")
    assert (meta["termination_reason"], meta["start_time"], rows, meta["engine"]["name"]) == (reason, None, [], "ray")
    assert {process["name"] for process in meta["processes"]} == {"client", "step0-g0-r0", "step1-g0-r0"}
