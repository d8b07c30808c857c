"""bench/tune_bench.py itself: what its rows count, how its grid is bracketed, with no job run."""
from __future__ import annotations

import itertools
import json
import os
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench import estimator_bench, tune_bench, tune_ray_bench
from bench.common import Effort, Goal
from bench.run import BENCHMARKS
from bench.tune_bench import CPU_EXAMPLE, EXAMPLE, TuneRun, grid_of, measure_grid, near_best_peak, ratio_row
from rnb.analysis.sweep import Trial, bisect_rate
from rnb.load import LoadSettings, mode_of
from rnb.tune.estimate import Estimator
from rnb.tune.hosts import hosts_of
from rnb.tune.profile import Bench
from rnb.tune.report import BEST, CANDIDATES
from rnb.tune.sim_records import Arrivals
from rnb.tune.space import Candidate, TuneSpace
from rnb.tune.verify import HIGH, LOW, Verified
from tests.support.tune_support import hand_profiles

BENCH = Bench("cpu", "local", host="test-host")


def _grid_of_two(space: TuneSpace) -> dict[Candidate, float]:
    return {space.minimal({(1, 0): 8}): 120.0, space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8}): 400.0}


@pytest.mark.parametrize(("returncode", "rate"), [(1, 0.0), (0, 0.0)])
def test_t2_counts_nothing_when_the_quick_tuner_found_and_verified_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, returncode: int, rate: float) -> None:
    space = tune_bench.example_space(EXAMPLE)
    monkeypatch.setattr(tune_bench, "tuned_run", lambda *args: TuneRun(128.0, rate, tmp_path, returncode))
    monkeypatch.setattr(tune_bench, "_grid", lambda *args: (2328.0, _grid_of_two(space), space))
    row, = tune_bench.t2(Effort.of(True))
    assert row.ratio is None and row.met is None
    assert row.note == (f"the quick tuner exited {returncode} with 0 req/s: it found and verified no configuration, "
                        "so its wall time counts for nothing")


def test_t2_counts_a_quick_tuner_that_found_a_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    space = tune_bench.example_space(EXAMPLE)
    (tmp_path / "best.json").write_text(json.dumps({"pipeline": [{"queue_groups": [{"gpus": [-1] * 4}]},
                                                                 {"queue_groups": [{"gpus": [-1]}]}]}))
    monkeypatch.setattr(tune_bench, "tuned_run", lambda *args: TuneRun(232.8, 374.0, tmp_path, 0))
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


@pytest.mark.parametrize(("engine", "goal"), [("local", tune_bench.T1_GOAL), ("ray", tune_bench.T4_GOAL)])
def test_each_side_s_bisection_finds_a_peak_closer_than_the_margin_of_its_row_s_goal(engine: str, goal: float) -> None:
    """A sharp knee anywhere in the first bracket: the peak found misses it by less than 1 - goal, and with one
    step fewer some knee is missed by more (what let the rungs of two predictions decide T1 on the CPU example)."""
    predicted = 200.0

    def worst_miss(steps: int) -> float:
        misses = []
        for knee in [predicted * (LOW + (HIGH - LOW) * i / 97) for i in range(1, 97)]:
            result = bisect_rate(lambda rate: Trial(rate, 50.0 if rate < knee else 150.0), LOW * predicted,
                                 HIGH * predicted, tune_bench.BOUND_MS, steps)
            assert result.best is not None and result.best.rate_per_s < knee
            misses.append(1.0 - result.best.rate_per_s / knee)
        return max(misses)

    steps = tune_bench.verify_steps(engine)
    assert tune_bench._settings(engine, Effort.of(True)).max_steps == steps
    assert worst_miss(steps) < 1.0 - goal < worst_miss(steps - 1)


def test_quick_keeps_the_full_budget_points_of_sleeping_steps_and_every_point_of_computing_ones() -> None:
    sleeping = tune_bench.example_space(EXAMPLE)
    assert len(grid_of(sleeping, Effort.of(True))) == 40 and len(grid_of(sleeping, Effort.of(False))) == 80
    computing = tune_bench.example_space(CPU_EXAMPLE)
    assert len(grid_of(computing, Effort.of(True), computes=True)) == 15   # (a, b) >= 1 with a + b <= 6


def test_the_rows_are_registered_with_bench_run() -> None:
    assert {"T1", "T1s", "T2", "T3", "T3c", "T4"} <= set(BENCHMARKS)


def test_t1_and_t2_measure_the_cpu_example_and_t2_takes_t1_s_first_grid_measurement(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """T2's grid is the very call T1's repetition 0 makes: functools.cache measures it once for both."""
    space = tune_bench.example_space(CPU_EXAMPLE)
    grids: list[tuple[object, ...]] = []

    def grid(*args: object) -> tuple[float, dict[Candidate, float], TuneSpace]:
        grids.append(args)
        return 600.0, {space.minimal({}): 180.0}, space

    monkeypatch.setattr(tune_bench, "tuned_run", lambda *args: TuneRun(150.0, 175.0, tmp_path, 0))
    monkeypatch.setattr(tune_bench, "_grid", grid)
    (tmp_path / "best.json").write_text(json.dumps({"pipeline": [{"queue_groups": [{"gpus": [-1] * 2}]},
                                                                 {"queue_groups": [{"gpus": [-1]}]}]}))
    t1, = tune_bench.t1(Effort.of(True))
    t2, = tune_bench.t2(Effort.of(True))
    assert "config/tune-cpu-example.json" in t1.what and "config/tune-cpu-example.json" in t2.what
    assert grids == [("local", True, CPU_EXAMPLE, None, rep, frozenset()) for rep in range(3)] + [grids[0]]
    assert (t1.ratio, t2.ratio) == (pytest.approx(175.0 / 180.0), pytest.approx(0.25))


def _tuner_out(out: Path, rows: list[tuple[str, list[int], float | None, float, list[float]]], best: list[int] | None) -> TuneRun:
    """A tuner's files: best.json (loaders' gpus), and a candidates table of finalists, each (label, loaders' gpus,
    predicted peak, verified peak, rates tried)."""
    table = []
    for index, (label, gpus, predicted, verified, tried) in enumerate(rows):
        config = out / f"finalist-{index}.json"
        config.write_text(json.dumps({"description": "finalist", "pipeline": [{"queue_groups": [{"gpus": gpus}]}]}))
        table.append({"key": f"finalist{index}", "short_label": label, "verified": True, "config_path": str(config),
                      "predicted_peak_rate_per_s": predicted, "measured_peak_rate_per_s": verified,
                      "verify_trials": json.dumps([{"rate_per_s": rate, "latency_ms": 90.0, "job_dir": None}
                                                   for rate in tried])})
    table.append({"key": "unverified", "short_label": "1", "verified": False, "config_path": None,
                  "predicted_peak_rate_per_s": 50.0,
                  "measured_peak_rate_per_s": None, "verify_trials": None})
    pq.write_table(pa.Table.from_pylist(table), out / CANDIDATES)
    if best is not None:
        (out / BEST).write_text(json.dumps({"run": {"mean_interval_ms": 10.0},
                                            "pipeline": [{"queue_groups": [{"gpus": best}]}]}))
    return TuneRun(300.0, 100.0 if best is not None else 0.0, out, 0 if best is not None else 1)


def test_t4e_is_the_error_of_the_prediction_of_the_finalist_the_tuner_chose(tmp_path: Path) -> None:
    # The tuner chose 3 (predicted 120, verified 100, the bound broke at 107); 4, the other finalist, is not it.
    run = _tuner_out(tmp_path, [("4", [-1] * 4, 150.0, 101.0, [90.0, 101.0, 140.0]),
                                ("3", [-1] * 3, 120.0, 100.0, [72.0, 100.0, 107.0, 120.0])], best=[-1] * 3)
    row = tune_ray_bench.chosen_error_row("T4e", run)
    assert row.ratio == pytest.approx(0.2) and row.met is False and row.goal == Goal("<=", 0.15)
    assert row.a is not None and row.a.median == 120.0 and row.b is not None and row.b.median == 100.0
    assert row.note == ("3: predicted 120, verified 100 req/s; the verification's resolution: the bound broke at "
                        "107 req/s, 7% above")


def test_t4e_has_no_figure_when_the_tuner_chose_nothing_or_predicted_no_rate(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    nothing = _tuner_out(tmp_path / "none", [("3", [-1] * 3, 120.0, 100.0, [100.0])], best=None)
    row = tune_ray_bench.chosen_error_row("T4e", nothing)
    assert row.ratio is None and row.note == "the tuner chose nothing (exit 1), so no error"
    (tmp_path / "unpredicted").mkdir()
    unpredicted = _tuner_out(tmp_path / "unpredicted", [("3", [-1] * 3, None, 100.0, [100.0])], best=[-1] * 3)
    row = tune_ray_bench.chosen_error_row("T4e", unpredicted)
    assert row.ratio is None and row.note == "3: verified at 100 req/s, predicted to meet the bound at no rate"


def test_t4_s_grid_takes_the_keys_of_every_finalist_the_tuner_verified(tmp_path: Path) -> None:
    run = _tuner_out(tmp_path, [("4", [-1] * 4, 150.0, 101.0, [101.0]), ("3", [-1] * 3, 120.0, 100.0, [100.0])],
                     best=[-1] * 3)
    assert tune_bench.finalist_keys(run) == ["finalist0", "finalist1"]
    assert tune_bench.finalist_keys(TuneRun(300.0, 0.0, tmp_path / "absent", 1)) == []


def test_a_tuner_s_choice_is_written_as_its_short_label_with_the_batcher_s_batch(tmp_path: Path) -> None:
    steps = [{"gpus": [-1] * 3}, {"gpus": [-1], "batch": 2}, {"gpus": [-1] * 2}, {"gpus": [-1]}]
    (tmp_path / BEST).write_text(json.dumps({"pipeline": [{"queue_groups": [group]} for group in steps]}))
    assert tune_bench._chosen(TuneRun(300.0, 162.2, tmp_path, 0)) == "3 | b2 | 2 | 1 at 162.2"
    assert tune_bench._chosen(TuneRun(300.0, 0.0, tmp_path / "absent", 1)) == "none (exit 1)"


def test_t3_predicts_a_poisson_job_s_p99_with_the_arrivals_its_client_drew() -> None:
    # meta.json's args of a Poisson job of T3c: its client sent request k at the k-th due time of its seed's draw.
    args = {"videos": 300, "mean_interval_ms": 8.0, "seed": 5, "warmup": 20, "queue_size": 50000, "engine": "local"}
    load = LoadSettings(mean_interval_ms=8.0)
    client = tuple(arrival.due_s for arrival in itertools.islice(mode_of(load).arrivals(load, 5), 300))
    assert estimator_bench.job_arrivals(args, 300) == Arrivals("trace", times=client)
    assert estimator_bench.job_arrivals({**args, "seed": 6}, 300).times != client
    assert estimator_bench.job_arrivals({"videos": 600, "mean_interval_ms": 0.0, "seed": 0}, 600) == Arrivals("bulk")


def test_near_best_peak_keeps_the_points_predicted_within_the_fraction_and_skips_those_whose_capacity_cannot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    space = tune_bench.example_space(EXAMPLE)
    estimator = Estimator(space, hand_profiles(space, BENCH), BENCH, tune_bench.BOUND_MS, 99.0, items=600)
    loaders = [space.candidate({(0, 0): n, (2, 0): 1, (3, 0): 1}, {(1, 0): 8}) for n in (1, 2, 3, 4)]
    simulated: list[Candidate] = []
    peak = estimator.peak

    def counted(candidate: Candidate) -> object:
        simulated.append(candidate)
        return peak(candidate)

    monkeypatch.setattr(estimator, "peak", counted)
    # about 120 loader items/s each: capacities 120, 241, 361 and 437 (the network at batch 8); peaks under the
    # bound none (one loader cannot fill batches of 8 in time), 205, 354 and 428
    assert near_best_peak(estimator, loaders, 0.25) == loaders[2:]
    assert simulated == [loaders[3], loaders[2]]   # 2 loaders' capacity, 241/s, cannot reach 0.75 x 428
    assert near_best_peak(estimator, loaders, 0.9) == loaders[1:]   # a point that meets the bound at no rate is out
    # the tuner's finalists are measured too, wherever their prediction puts them
    assert near_best_peak(estimator, loaders, 0.25, frozenset({loaders[0].key, loaders[3].key})) == [
        loaders[0], loaders[2], loaders[3]]


def test_t4_s_jobs_share_one_simulated_cluster_of_its_labels_on_this_host_whose_address_they_get_only_inside(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    space = tune_bench.example_space(tune_ray_bench.ray_example(tmp_path))
    with tune_ray_bench.ray_address_of_every_job(["loaders", "nets"]) as address:
        assert os.environ["RAY_ADDRESS"] == address and address.startswith("127.0.0.1:")
        pools = hosts_of(space.config, "ray", None, 2.0)   # asks the running cluster, as rnb-tune does
    assert "RAY_ADDRESS" not in os.environ
    assert (dict(pools.pools), pools.cores) == ({"loaders": 0, "nets": 0}, (2.0,))
    with socket.socket() as probe:   # its GCS is gone with it
        assert probe.connect_ex(("127.0.0.1", int(address.rpartition(":")[2]))) != 0
