"""bench/tune_bench.py itself: what its rows count, how its grid is bracketed, with no job run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tune_bench
from bench.common import Effort, Goal
from bench.run import BENCHMARKS
from bench.tune_bench import CPU_EXAMPLE, EXAMPLE, TuneRun, grid_of, measure_grid, ratio_row
from rnb.tune.estimate import Estimator
from rnb.tune.profile import Bench
from rnb.tune.space import Candidate, TuneSpace
from rnb.tune.verify import Verified
from tests.tune_support import hand_profiles

BENCH = Bench("cpu", "local", host="test-host")


def _grid_of_two(space: TuneSpace) -> dict[Candidate, float]:
    return {space.minimal({(1, 0): 8}): 120.0, space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8}): 400.0}


@pytest.mark.parametrize(("returncode", "rate"), [(1, 0.0), (0, 0.0)])
def test_t2_counts_nothing_when_the_quick_tuner_found_and_verified_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, returncode: int, rate: float) -> None:
    space = tune_bench.example_space(EXAMPLE)
    monkeypatch.setattr(tune_bench, "_tuner", lambda *args: TuneRun(128.0, rate, tmp_path, returncode))
    monkeypatch.setattr(tune_bench, "_grid", lambda *args: (2328.0, _grid_of_two(space), space))
    row, = tune_bench.t2(Effort.of(True))
    assert row.ratio is None and row.met is None
    assert row.note == (f"the quick tuner exited {returncode} with 0 req/s: it found and verified no configuration, "
                        "so its wall time counts for nothing")


def test_t2_counts_a_quick_tuner_that_found_a_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    space = tune_bench.example_space(EXAMPLE)
    (tmp_path / "best.json").write_text(json.dumps({"pipeline": [{"queue_groups": [{"gpus": [-1] * 4}]},
                                                                 {"queue_groups": [{"gpus": [-1]}]}]}))
    monkeypatch.setattr(tune_bench, "_tuner", lambda *args: TuneRun(232.8, 374.0, tmp_path, 0))
    monkeypatch.setattr(tune_bench, "_grid", lambda *args: (2328.0, _grid_of_two(space), space))
    row, = tune_bench.t2(Effort.of(True))
    assert row.ratio == pytest.approx(0.1) and row.met
    assert row.note == "one run each; the grid is 2 points; the quick tuner found 4 | 1 at 374 req/s"


def test_t1_gives_the_spread_of_every_pairing_of_its_repetitions() -> None:
    row = ratio_row("T1", "what", Goal(">=", 0.95), [350.0, 340.0, 360.0], [358.0, 350.0, 365.0], "note")
    assert row.ratio == pytest.approx(350.0 / 358.0)
    assert row.low == pytest.approx(340.0 / 365.0) and row.high == pytest.approx(360.0 / 350.0)
    assert row.reps == 3 and row.a is not None and row.a.values == (350.0, 340.0, 360.0)
    empty = ratio_row("T1", "what", Goal(">=", 0.95), [350.0], [0.0], "note")
    assert empty.ratio is None and empty.note == "note; a grid measurement had no point that met the bound, so no ratio"


def test_the_grid_is_bracketed_around_each_point_s_predicted_peak_and_its_directory_made(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    space = tune_bench.example_space(EXAMPLE)
    estimator = Estimator(space, hand_profiles(space, BENCH), BENCH, tune_bench.BOUND_MS, 99.0, items=600)
    centres: dict[Candidate, float] = {}

    def verify(space: TuneSpace, candidate: Candidate, predicted: float, out: Path, *rest: object) -> Verified:
        centres[candidate] = predicted
        return Verified(candidate, out / "c.json", (), None, None)

    monkeypatch.setattr(tune_bench, "verify", verify)
    grid = list(_grid_of_two(space))
    _, rates = measure_grid(space, grid, estimator, tmp_path / "grid" / "deeper", "local", Effort.of(True))
    assert (tmp_path / "grid" / "deeper" / "grid.log").is_file()
    assert rates == {candidate: 0.0 for candidate in grid}
    minimal, best = grid
    assert centres[best] == estimator.peak(best).rate_per_s   # as rnb-tune brackets a finalist
    # One loader cannot fill batches of 8 in time: no rate meets the bound, and the bracket sits at half its capacity.
    assert estimator.peak(minimal).rate_per_s is None
    assert centres[minimal] == pytest.approx(0.5 * estimator.peak(minimal).capacity_per_s)


def test_quick_keeps_the_full_budget_points_of_sleeping_steps_and_every_point_of_computing_ones() -> None:
    sleeping = tune_bench.example_space(EXAMPLE)
    assert len(grid_of(sleeping, Effort.of(True))) == 40 and len(grid_of(sleeping, Effort.of(False))) == 80
    computing = tune_bench.example_space(CPU_EXAMPLE)
    assert len(grid_of(computing, Effort.of(True), computes=True)) == 15   # (a, b) >= 1 with a + b <= 6


def test_the_rows_are_registered_with_bench_run() -> None:
    assert {"T1", "T1c", "T2", "T3", "T3c", "T4"} <= set(BENCHMARKS)
