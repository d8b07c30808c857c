"""The verification's repeated jobs per rate: the majority decides, the median job is the rate's trial, and the
trial log lets a second run repeat no job.  Jobs are scripted (no benchmark runs): rate -> the latencies its jobs
measure, in order."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rnb.analysis.jobs import ValidityRules
from rnb.analysis.sweep import RunOutcome, Trial
from rnb.tune import verify as verify_module
from rnb.tune.space import Budget
from rnb.tune.tuning_config import read_space
from rnb.tune.verify import VerifySettings, decided, median_job, verify
from tests.support.tune_support import EXAMPLE, example_document

BOUND_MS = 100.0


def scripted(monkeypatch: pytest.MonkeyPatch, latencies: dict[float, list[float]]) -> list[float]:
    """Each job at a rate measures the next of its latencies; returns the rates of the jobs run, in order."""
    ran: list[float] = []

    def measure_valid(run: Callable[[float, int | None], RunOutcome], rate_per_s: float, percentile: float,
                      rules: ValidityRules, max_reruns: int) -> Trial:
        rate = round(rate_per_s, 6)   # 1.15 x 100 is 114.99999999999999
        ran.append(rate)
        return Trial(rate, latencies[rate].pop(0), Path(f"job-{len(ran)}"))

    monkeypatch.setattr(verify_module, "measure_valid", measure_valid)
    return ran


def test_a_rate_runs_until_its_majority_is_decided_and_its_median_job_is_its_trial(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    space = read_space(example_document(), str(EXAMPLE), Budget(cpu_slots=6))
    candidate = next(iter(space.grid()))
    # predicted 100 req/s: the bracket's ends are 60 and 115 req/s
    ran = scripted(monkeypatch, {60.0: [90.0, 120.0, 95.0], 115.0: [130.0, 140.0]})
    settings = VerifySettings(BOUND_MS, 99.0, max_steps=0, repeats=3)
    done = verify(space, candidate, 100.0, tmp_path, settings, widen=False)
    assert ran == [60.0, 60.0, 60.0, 115.0, 115.0]   # 60: one of two failed, so a third; 115: two failures settle it
    assert done.best == Trial(60.0, 95.0, Path("job-3"))     # the median of 90, 120, 95
    assert done.above == Trial(115.0, 140.0, Path("job-5"))  # of two that agree, the slower
    assert [t.rate_per_s for t in done.trials] == [60.0, 115.0]

    again = scripted(monkeypatch, {})
    assert verify(space, candidate, 100.0, tmp_path, settings, widen=False) == done
    assert again == []   # every job was in the trial log


def test_one_job_per_rate_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    space = read_space(example_document(), str(EXAMPLE), Budget(cpu_slots=6))
    ran = scripted(monkeypatch, {60.0: [120.0]})
    done = verify(space, next(iter(space.grid())), 100.0, tmp_path, VerifySettings(BOUND_MS, 99.0), widen=False)
    assert ran == [60.0] and done.best is None and done.above == Trial(60.0, 120.0, Path("job-1"))


def test_decided_and_median_job() -> None:
    passing, failing, missed = Trial(50.0, 80.0), Trial(50.0, 130.0), Trial(50.0, float("inf"))
    assert decided([passing], 1, BOUND_MS) and not decided([passing], 3, BOUND_MS)
    assert decided([passing, passing], 3, BOUND_MS) and not decided([passing, failing], 3, BOUND_MS)
    assert decided([passing, failing], 2, BOUND_MS)   # an even count runs them all
    assert decided([missed, failing], 3, BOUND_MS)
    assert median_job([passing, failing]) == failing   # a tie fails: the slower of two
    assert median_job([missed, passing, failing]) == failing
