"""Tuner benchmarks: T1 (does rnb-tune find the best?), T2 (how much cheaper than measuring the grid?),
T3 (how far off are the estimator's predictions?), T4 (T1 on the Ray engine).

All run on config/tune-example.json with a budget of 6 CPU slots and a p99
bound of 100 ms, whose optimum is worked out by hand in docs/tuner.md.  The
grid is measured with the tuner's own verification (the sweep's bisection
over the Poisson rate, VALID jobs only), each point bracketed around the
capacity its profiles give, so a grid point and a finalist are measured
alike.  Each figure comes from one run of each side: a tuner run or a grid
measurement takes minutes to hours, so no row repeats them (the note says so).

    python bench/run.py --only T1,T2,T3 [--quick]
"""
from __future__ import annotations

import functools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Effort, Goal, Row, Side
from rnb.analysis.jobs import JobRow, ValidityRules, read_job, summarize_job
from rnb.analysis.sweep import RunOutcome, run_benchmark
from rnb.tune.estimate import Arrivals, Estimator
from rnb.tune.profile import Bench, ProfileCache, plan_profiles, profile_all
from rnb.tune.report import BEST
from rnb.tune.space import Budget, Candidate, TuneSpace, read_space
from rnb.tune.verify import VerifySettings, verify

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "tune-example.json"
SLOTS = 6
BOUND_MS = 100.0
PERCENTILE = 99.0
T3_CONFIGS = 8
# The Ray variant of the example: loaders on nodes labelled loaders, the rest on nets (a simulated
# two-node cluster on this machine).
RAY_NODES = ("loaders", "nets", "nets", "nets")
T4_QUICK_WITHIN = 0.25   # T4 --quick measures the points predicted within 25% of the best (T3: errors of 2-5%)


@dataclass(frozen=True)
class TuneRun:
    """One rnb-tune run: its wall time and the peak rate its best.json was measured at (0 without one)."""

    seconds: float
    rate_per_s: float
    out: Path


def run_tuner(config: Path, out: Path, engine: str, search: str, effort: Effort) -> TuneRun:
    """rnb-tune in a child process, as a user runs it."""
    command = [sys.executable, "-m", "rnb.tune.cli", "-c", str(config), "--cpu-slots", str(SLOTS),
               "--latency-bound-ms", str(BOUND_MS), "--percentile", str(PERCENTILE), "--search", search,
               "--engine", engine, "--out", str(out), *_effort_flags(effort)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"rnb-tune exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    best = out / BEST
    rate = 0.0
    if best.is_file():
        rate = 1000.0 / float(json.loads(best.read_text())["run"]["mean_interval_ms"])
    return TuneRun(seconds, rate, out)


def _effort_flags(effort: Effort) -> list[str]:
    return ["--verify-steps", str(_verify_steps(effort)), "--profile-calls", "60" if effort.quick else "150",
            "--verify-seconds", "2" if effort.quick else "3"]


def _verify_steps(effort: Effort) -> int:
    """Bisection steps per measured point after its two ends: 2 resolve a peak to about 7% of its prediction."""
    return 2 if effort.quick else 3


def _settings(engine: str, effort: Effort) -> VerifySettings:
    return VerifySettings(BOUND_MS, PERCENTILE, engine, max_steps=_verify_steps(effort),
                          seconds=2.0 if effort.quick else 3.0)


def example_space(config: Path) -> TuneSpace:
    return read_space(json.loads(config.read_text()), str(config), Budget(cpu_slots=SLOTS))


def grid_of(space: TuneSpace, effort: Effort) -> list[Candidate]:
    """Every grid point; --quick keeps those that use the whole budget (a replica more never lowers capacity)."""
    grid = list(space.grid())
    if effort.quick:
        grid = [c for c in grid if space.cpu_slots_used(c) == SLOTS]
    return grid


def measure_grid(space: TuneSpace, grid: list[Candidate], estimator: Estimator, out: Path, engine: str,
                 effort: Effort) -> tuple[float, dict[Candidate, float]]:
    """Each grid point's measured peak rate under the bound, and the wall time all of them took."""
    settings = _settings(engine, effort)
    rates: dict[Candidate, float] = {}
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grid.log", "a", encoding="utf-8") as output:
        for candidate in grid:
            guess = 0.85 * estimator.pipeline(candidate).capacity_per_s()
            rates[candidate] = verify(space, candidate, guess, out, settings, output).rate
    return time.perf_counter() - started, rates


@functools.cache
def profiled(config: Path, engine: str, quick: bool) -> tuple[TuneSpace, Estimator]:
    """The example's space and an estimator on profiles measured here (what T1's grid brackets and T3 predict with)."""
    space = example_space(config)
    bench = Bench("cpu", engine)
    work = Path(tempfile.mkdtemp(prefix=f"rnb-profiles-{engine}-"))
    jobs = plan_profiles(space, bench, 60 if quick else 150)

    with open(work / "profiles.log", "a", encoding="utf-8") as output:
        def run(config_path: Path, videos: int) -> RunOutcome:
            flags = ["-v", str(videos), "--warmup", "0", "--engine", engine]
            return run_benchmark(str(config_path), 0.0, work / "logs", flags, output=output)

        profiles = profile_all(jobs, ProfileCache(work / "profiles"), run)
    return space, Estimator(space, profiles, bench, BOUND_MS, PERCENTILE)


@functools.cache
def _tuner(engine: str, search: str, quick: bool, config: Path) -> TuneRun:
    """One rnb-tune run, shared by the rows that read it."""
    work = Path(tempfile.mkdtemp(prefix=f"rnb-tune-{engine}-{search}-"))
    return run_tuner(config, work / "tune", engine, search, Effort.of(quick))


@functools.cache
def _grid(engine: str, quick: bool, config: Path, within: float | None) -> tuple[float, dict[Candidate, float],
                                                                            TuneSpace]:
    """The grid measured (its wall time, each point's peak rate), T1's and T2's other side.

    `within` keeps only the points whose predicted capacity is within that
    fraction of the best prediction: what T4 measures with --quick, where
    a Ray verification job took about 35 s here against 15-20 s locally.
    Required, not defaulted: the cache keys a call by how it was written.
    """
    effort = Effort.of(quick)
    space, estimator = profiled(config, engine, quick)
    grid = grid_of(space, effort)
    if within is not None:
        capacity = {c: estimator.pipeline(c).capacity_per_s() for c in grid}
        grid = [c for c in grid if capacity[c] >= (1.0 - within) * max(capacity.values())]
    work = Path(tempfile.mkdtemp(prefix=f"rnb-grid-{engine}-"))
    seconds, rates = measure_grid(space, grid, estimator, work, engine, effort)
    return seconds, rates, space


def _t1_row(id: str, engine: str, effort: Effort, config: Path, what: str, within: float | None = None) -> Row:
    tuned = _tuner(engine, "auto", effort.quick, config)
    _, rates, space = _grid(engine, effort.quick, config, within)
    best = max(rates, key=lambda c: rates[c])
    grid_best = rates[best]
    kept = (f"full-budget points predicted within {within:.0%} of the best capacity, " if within is not None
            else "full-budget points only, " if effort.quick else "")
    note = (f"one tuner run and one measurement of {len(rates)} grid points "
            f"({kept}bisection steps {_verify_steps(effort)}); "
            f"the grid's best: {space.short_label(best)} at {grid_best:.4g} req/s")
    if grid_best <= 0:
        return Row(id, what, Goal(">=", 0.95), note=note + "; no grid point met the bound, so no ratio")
    return Row(id, what, Goal(">=", 0.95), Side("tuner's best", "req/s", tuned.rate_per_s),
               Side("grid's best", "req/s", grid_best), tuned.rate_per_s / grid_best, reps=1, note=note)


def t1(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    return [_t1_row("T1", "local", effort, config, f"rnb-tune's verified best under p99 < {BOUND_MS:g} ms / the best "
                    f"of the measured grid ({SLOTS} CPU slots, config/tune-example.json)")]


def t2(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    quick_run = _tuner("local", "quick", effort.quick, config)
    grid_seconds, rates, _ = _grid("local", effort.quick, config, None)
    return [Row("T2", "wall time of rnb-tune --search quick (profiling included) / of measuring the whole grid",
                Goal("<=", 0.25), Side("tuner (quick)", "s", quick_run.seconds), Side("grid", "s", grid_seconds),
                quick_run.seconds / grid_seconds, reps=1,
                note=f"one run each; the grid is {len(rates)} points; the quick tuner found "
                     f"{quick_run.rate_per_s:.4g} req/s")]


def t3(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    """Predicted against measured, per config: bulk throughput, and the p99 at 70% of the measured bulk rate."""
    space, estimator = profiled(config, "local", effort.quick)
    grid = list(space.grid())
    picked = [grid[round(i * (len(grid) - 1) / (T3_CONFIGS - 1))] for i in range(T3_CONFIGS)]
    work = Path(tempfile.mkdtemp(prefix="rnb-T3-"))
    throughput_errors, latency_errors, details = [], [], []
    rules = ValidityRules()
    with open(work / "t3.log", "a", encoding="utf-8") as output:
        for index, candidate in enumerate(picked):
            path = work / f"config-{index}.json"
            path.write_text(json.dumps(space.document_for(candidate)))
            videos = 600 if effort.quick else 1500
            bulk = run_benchmark(str(path), 0.0, work / "logs", ["-v", str(videos), "--warmup", "0"], output=output)
            measured = _number(summarize_job(read_job(bulk.job_dir), rules), "measured_throughput_items_per_s")
            # predicted as the job ran: as many items, none left out as warm-up
            predicted = estimator.at(candidate, Arrivals("bulk"), videos, warmup=0)
            throughput_errors.append(abs(predicted.throughput_items_per_s - measured) / measured)
            rate = 0.7 * measured
            count = max(500, math.ceil(rate * 3))
            poisson = run_benchmark(str(path), 1000.0 / rate, work / "logs", ["-v", str(count), "--warmup", "20"],
                                    output=output)
            measured_p99 = _number(summarize_job(read_job(poisson.job_dir), rules), "e2e_p99_ms")
            predicted_p99 = estimator.at(candidate, Arrivals.poisson(rate), count, warmup=20).latency_ms[99.0]
            latency_errors.append(abs(predicted_p99 - measured_p99) / measured_p99)
            details.append(f"{space.short_label(candidate)}: {predicted.throughput_items_per_s:.0f} vs {measured:.0f} "
                           f"items/s, p99 {predicted_p99:.0f} vs {measured_p99:.0f} ms")
    note = "; ".join(details)
    return [
        Row("T3", f"estimator error: median over {T3_CONFIGS} configs of |predicted - measured| / measured bulk "
                  "throughput", Goal("<=", 0.10), Side("error", "fraction", statistics.median(throughput_errors),
                                                      tuple(throughput_errors)),
            None, statistics.median(throughput_errors), min(throughput_errors), max(throughput_errors),
            len(throughput_errors), note=f"predicted vs measured: {note}"),
        Row("T3p", "estimator error of the p99 latency at 70% of the measured bulk rate (median over the same configs)",
            Goal("<=", 0.25), Side("error", "fraction", statistics.median(latency_errors), tuple(latency_errors)), None,
            statistics.median(latency_errors), min(latency_errors), max(latency_errors), len(latency_errors)),
    ]


def _number(row: JobRow, column: str) -> float:
    """A number of a jobs-table row; a job that measured none has no error to report."""
    value = row.get(column)
    if not isinstance(value, (int, float)):
        raise RuntimeError(f"{row.get('job_dir')}: the job measured no {column}")
    return float(value)


def ray_example(work: Path, config: Path = EXAMPLE) -> Path:
    """The example with each step's group on a node label: on Ray without an address, a simulated cluster."""
    document = json.loads(config.read_text())
    for step, node in zip(document["pipeline"], RAY_NODES):
        for group in step["queue_groups"]:
            group["node"] = node
    path = work / "tune-example-ray.json"
    path.write_text(json.dumps(document, indent=1))
    return path


def t4(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="rnb-T4-"))
    row = _t1_row("T4", "ray", effort, ray_example(work, config),
                  "T1 on the Ray engine (a simulated two-node cluster: loaders / the rest)",
                  T4_QUICK_WITHIN if effort.quick else None)
    return [Row(row.id, row.what, None, row.a, row.b, row.ratio, row.low, row.high, row.reps, row.note)]
