"""A job stopped by a signal at one instant of its start-up, as the reliability bench's trials stop it (bench/fault_starts.py).

The local engine's tests and the Ray engine's stop jobs at the same instants and expect the same endings.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.fault_jobs import JobRun, run_job
from bench.fault_starts import INSTANTS, TURNS, strike_at
from bench.faults import start_up_config


def stopped_at(tmp_path: Path, instant_name: str, turn: int) -> tuple[JobRun, int, str]:
    """Run the bench's start-up trial for one instant (bench/fault_starts.py), the signal to the process group being
    TURNS[turn]: the run, and the exit code and termination reason the stop must give."""
    instant = next(instant for instant in INSTANTS if instant.name == instant_name)
    number, code, reason = TURNS[turn]
    config, extra = start_up_config(instant, tmp_path)
    (tmp_path / "job.json").write_text(json.dumps(config))
    run, struck = run_job(tmp_path, ["-c", str(tmp_path / "job.json"), *instant.argv, *extra],
                          strike_at(instant, tmp_path / "stderr", tmp_path / "logs", number), isolated=False,
                          env=instant.env())
    assert struck is not None, f"the job never reached {instant.what}"
    return run, code, reason
