"""Tuner benchmarks: T1 (does rnb-tune find the best?), T2 (how much cheaper than measuring the grid?),
T3 (how far off are the estimator's predictions?), T4 (T1 on the Ray engine) and T4e (the estimator's error
for the candidate the tuner chose there), T1s (T1 on steps that sleep) and T3c (T3 on steps that compute).
T3 and T3c are bench/estimator_bench.py's, T4 and T4e bench/tune_ray_bench.py's.

T1, T2 and T3c run on config/tune-cpu-example.json (steps that compute on
the CPU), T1s, T3 and T4 on config/tune-example.json (steps that sleep),
each with a budget of 6 CPU slots and a p99 bound of 100 ms (200 ms on
Ray, T4: see RAY_BOUND_MS); both optima are worked out by hand in
docs/tuner.md.  The grid is measured with the
tuner's own verification (the sweep's bisection over the Poisson rate,
VALID jobs only), each point bracketed around its predicted peak as the
tuner brackets a finalist, so a grid point and a finalist are measured
alike.  T1 and T1s repeat each side
TUNE_REPS times and give the spread of the ratio, so that a "met" can be
told from the noise.

    python bench/run.py --only T1,T2,T3,T3c,T4,T1s [--quick]
"""
from __future__ import annotations

import dataclasses
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

import pyarrow.parquet as pq

from bench.common import Effort, Goal, Row, Side
from rnb.analysis.sweep import RunOutcome, run_benchmark
from rnb.tune.estimate import Estimator
from rnb.tune.hosts import hosts_of
from rnb.tune.profile import SAMPLE_INTERVAL_MS, Bench
from rnb.tune.profile_cache import ProfileCache, profile_all
from rnb.tune.profile_plan import plan_profiles
from rnb.tune.report import BEST, CANDIDATES
from rnb.tune.space import Budget, Candidate, TuneSpace
from rnb.tune.tuning_config import read_space
from rnb.tune.verify import HIGH, LOW, VerifySettings, verify

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "tune-example.json"
CPU_EXAMPLE = REPO / "config" / "tune-cpu-example.json"
SLOTS = 6
BOUND_MS = 100.0
# T4's bound. On Ray here the example's p99 is 68-84 ms at 10 req/s (2 | b1 | 2 | 1) and 90-119 ms from 17 to 80 req/s
# for every b2 point the tuner chose: at 100 ms each verification read the host's noise, not the configuration
# (the same point and rate passed one job and failed the next). At 200 ms the bound breaks where the p99 climbs
# steeply, near what the cores can carry (3 | b8 | 1 | 1: 118 ms at 197 req/s, 306 ms at 245).
RAY_BOUND_MS = 200.0
PERCENTILE = 99.0

TUNE_REPS = 3            # tuner runs and grid measurements per side of T1 and T1s

T1_GOAL = 0.95          # T1's and T1s's goal: the tuner's verified best / the grid's
T4_GOAL = 0.90          # T4's: the same on Ray
T4_QUICK_WITHIN = 0.25   # T4 --quick measures the points predicted within 25% of the best (T3: errors of 2-5%)
# Jobs per verified rate on Ray, both sides alike: one Ray job's p99 moved from 97 to 174 ms between two runs of the
# same config, rate and arrivals here, so a single job let one lucky minute decide a grid point.
RAY_VERIFY_REPEATS = 3


@dataclass(frozen=True)
class TuneRun:
    """One rnb-tune run: its wall time, exit code and the peak rate its best.json was measured at (0 without one)."""

    seconds: float
    rate_per_s: float
    out: Path
    returncode: int = 0

    @property
    def found(self) -> bool:
        """Whether it found and verified a configuration: exit 0 and a best.json with a rate."""
        return self.returncode == 0 and self.rate_per_s > 0


def run_tuner(config: Path, out: Path, engine: str, search: str, effort: Effort) -> TuneRun:
    """rnb-tune in a child process, as a user runs it."""
    command = [sys.executable, "-m", "rnb.tune.cli", "-c", str(config), "--cpu-slots", str(SLOTS),
               "--latency-bound-ms", str(bound_ms(engine)), "--percentile", str(PERCENTILE), "--search", search,
               "--engine", engine, "--out", str(out), "--verify-repeats", str(_repeats(engine)),
               *_effort_flags(engine, effort)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"rnb-tune exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    best = out / BEST
    rate = 0.0
    if best.is_file():
        rate = 1000.0 / float(json.loads(best.read_text())["run"]["mean_interval_ms"])
    return TuneRun(seconds, rate, out, done.returncode)


def _effort_flags(engine: str, effort: Effort) -> list[str]:
    return ["--verify-steps", str(verify_steps(engine)), "--profile-calls", "60" if effort.quick else "150",
            "--verify-seconds", "2" if effort.quick else "3"]


def verify_steps(engine: str) -> int:
    """Bisection steps per measured point after its two ends: enough that a peak anywhere in the first bracket (60%
    to 115% of the prediction) is found within the margin of the engine's row (T1: 5%, 5 steps; T4: 10%, 4), the
    bisection stopping earlier once its bracket is within 5% (4 steps for a peak near its prediction).  With 2
    (up to 23% below a peak) the two sides' rungs alone could decide a row: the same 2 | 1 of the CPU example,
    bracketed around two predictions from different profiles, verified at 168 by the tuner and 186.5 by the grid."""
    margin = 1.0 - (T4_GOAL if engine == "ray" else T1_GOAL)
    return math.ceil(math.log2((HIGH - LOW) / (LOW * margin)))


def bound_ms(engine: str) -> float:
    """The p99 bound of the engine's rows."""
    return RAY_BOUND_MS if engine == "ray" else BOUND_MS


def _repeats(engine: str) -> int:
    return RAY_VERIFY_REPEATS if engine == "ray" else 1


def _settings(engine: str, effort: Effort) -> VerifySettings:
    return VerifySettings(bound_ms(engine), PERCENTILE, engine, max_steps=verify_steps(engine),
                          seconds=2.0 if effort.quick else 3.0, repeats=_repeats(engine))


def example_space(config: Path) -> TuneSpace:
    return read_space(json.loads(config.read_text()), str(config), Budget(cpu_slots=SLOTS))


def grid_of(space: TuneSpace, effort: Effort, computes: bool = False) -> list[Candidate]:
    """Every grid point; --quick keeps those that use the whole budget (a replica more never lowers the capacity
    of steps that sleep), except where something computes (`computes`: the CPU example's steps, or a Ray hop's
    CPU): there the cores bound every point beyond the smallest few, and a replica more can cost throughput."""
    grid = list(space.grid())
    if effort.quick and not computes:
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
            rates[candidate] = verify(space, candidate, bracket_centre(estimator, candidate), out, settings, output).rate
    return time.perf_counter() - started, rates


def bracket_centre(estimator: Estimator, candidate: Candidate) -> float:
    """Where a grid point's bisection starts: its predicted peak, as rnb-tune starts a finalist's."""
    peak = estimator.peak(candidate)
    return peak.rate_per_s or 0.5 * peak.capacity_per_s


@functools.cache
def profiled(config: Path, engine: str, quick: bool) -> tuple[TuneSpace, Estimator]:
    """The example's space and an estimator on profiles measured here (what T1's grid brackets and T3 predict with)."""
    space = example_space(config)
    bench = Bench("cpu", engine)
    bench = dataclasses.replace(bench, hosts=hosts_of(space.config, engine, None, bench.cores.usable))
    work = Path(tempfile.mkdtemp(prefix=f"rnb-profiles-{engine}-"))
    jobs = plan_profiles(space, bench, 60 if quick else 150)

    with open(work / "profiles.log", "a", encoding="utf-8") as output:
        def run(config_path: Path, videos: int) -> RunOutcome:
            flags = ["-v", str(videos), "--warmup", "0", "--engine", engine, "--sample-interval-ms", str(SAMPLE_INTERVAL_MS)]
            return run_benchmark(str(config_path), 0.0, work / "logs", flags, output=output)

        profiles = profile_all(jobs, ProfileCache(work / "profiles"), run)
    return space, Estimator(space, profiles, bench, bound_ms(engine), PERCENTILE)


@functools.cache
def tuned_run(engine: str, search: str, quick: bool, config: Path, rep: int) -> TuneRun:
    """One rnb-tune run (repetition `rep`, from scratch: its own profiles), shared by the rows that read it."""
    work = Path(tempfile.mkdtemp(prefix=f"rnb-tune-{engine}-{search}-{rep}-"))
    return run_tuner(config, work / "tune", engine, search, Effort.of(quick))


@functools.cache
def _grid(engine: str, quick: bool, config: Path, within: float | None, rep: int,
          verified: frozenset[str]) -> tuple[float, dict[Candidate, float], TuneSpace]:
    """The grid measured once more (repetition `rep`): its wall time and each point's peak rate, T1's and T2's
    other side.

    `within` keeps only the points whose predicted peak under the bound is
    within that fraction of the best prediction, and those whose keys are
    in `verified` (the tuner's finalists): what T4 measures with --quick,
    where a Ray verification job took about 25 s here against 5-10 s
    locally.  Without the finalists the grid's window, drawn from its own
    profiles, left out the point the tuner chose and measured best (T4 read
    1.48 on 2026-12-03: the tuner's 118.9 req/s over a grid whose points
    mostly met the bound at no rate).  On Ray every point is a candidate,
    not only those that use the whole budget: its hops compute, so a
    replica more can cost (a run of 3 | b4 | 1 | 1 measured 219 req/s where
    3 | b4 | 2 | 1 measured 198).
    Required, not defaulted: the cache keys a call by how it was written.
    """
    effort = Effort.of(quick)
    space, estimator = profiled(config, engine, quick)
    grid = grid_of(space, effort, computes=config == CPU_EXAMPLE or engine == "ray")
    if within is not None:
        grid = near_best_peak(estimator, grid, within, verified)
    work = Path(tempfile.mkdtemp(prefix=f"rnb-grid-{engine}-{rep}-"))
    seconds, rates = measure_grid(space, grid, estimator, work, engine, effort)
    return seconds, rates, space


def near_best_peak(estimator: Estimator, grid: list[Candidate], within: float,
                   also: frozenset[str] = frozenset()) -> list[Candidate]:
    """The points whose predicted peak rate under the bound is at least (1 - within) of the best one's, and those
    whose keys are in `also`, in grid order.

    A point's peak is at most its capacity, so points are simulated in
    order of capacity and the rest skipped once none can reach; where no
    point is predicted to meet the bound, every point is kept.
    """
    capacity = {c: estimator.pipeline(c).capacity_per_s() for c in grid}
    peaks: dict[Candidate, float] = {}
    for candidate in sorted(grid, key=lambda c: capacity[c], reverse=True):
        if capacity[candidate] < (1.0 - within) * max(peaks.values(), default=0.0):
            break
        peaks[candidate] = estimator.peak(candidate).rate_per_s or 0.0
    floor = (1.0 - within) * max(peaks.values())
    return [c for c in grid if (c in peaks and peaks[c] >= floor) or c.key in also]


def ratio_row(id: str, what: str, goal: Goal | None, tuned: list[float], grid_bests: list[float], note: str) -> Row:
    """The tuner's best over the grid's, median over median, with the spread of every pairing of repetitions."""
    if min(grid_bests) <= 0:
        return Row(id, what, goal, note=note + "; a grid measurement had no point that met the bound, so no ratio")
    ratio = statistics.median(tuned) / statistics.median(grid_bests)
    return Row(id, what, goal, Side.of("tuner's best", "req/s", tuned), Side.of("grid's best", "req/s", grid_bests),
               ratio, min(tuned) / max(grid_bests), max(tuned) / min(grid_bests), len(tuned), note=note)


def t1_row(id: str, engine: str, effort: Effort, config: Path, what: str, goal: Goal | None,
            within: float | None = None, reps: int = TUNE_REPS) -> Row:
    tuned = [tuned_run(engine, "auto", effort.quick, config, rep) for rep in range(reps)]
    verified = frozenset(key for run in tuned for key in finalist_keys(run)) if within is not None else frozenset()
    grids = [_grid(engine, effort.quick, config, within, rep, verified) for rep in range(reps)]
    space = grids[0][2]
    bests = [max(rates, key=lambda c: rates[c]) for _, rates, _ in grids]
    kept = (f"points predicted to peak within {within:.0%} of the best under the bound and the tuner's "
            f"{len(verified)} finalists, " if within is not None
            else "full-budget points only, " if effort.quick and config != CPU_EXAMPLE else "")
    repeats = _repeats(engine)
    per_rate = f", each rate the majority of up to {repeats} jobs" if repeats > 1 else ""
    note = (f"{reps} tuner runs and {reps} measurements of {len(grids[0][1])} grid points "
            f"({kept}bisection steps {verify_steps(engine)}{per_rate}, both sides bracketing each peak around its "
            f"prediction); the tuner's choices: {', '.join(_chosen(run) for run in tuned)}; the grid's best: "
            + ", ".join(f"{space.short_label(best)} at {rates[best]:.4g} req/s" for best, (_, rates, _) in zip(bests, grids)))
    return ratio_row(id, what, goal, [run.rate_per_s for run in tuned], [rates[best] for best, (_, rates, _) in
                                                                          zip(bests, grids)], note)


def finalist_keys(run: TuneRun) -> list[str]:
    """The candidates a tuner run verified, by key; none where it wrote no candidates table."""
    table = run.out / CANDIDATES
    if not table.is_file():
        return []
    return [row["key"] for row in pq.read_table(table, columns=["key", "verified"]).to_pylist() if row["verified"]]


def _chosen(run: TuneRun) -> str:
    """What a tuner run chose, as its best.json's replicas per step (bN for a Batcher's batch, as the tuner's short
    labels write it), or why it chose nothing."""
    best = run.out / BEST
    if not best.is_file():
        return f"none (exit {run.returncode})"
    groups = [step["queue_groups"][0] for step in json.loads(best.read_text())["pipeline"]]
    return (" | ".join(f"b{group['batch']}" if "batch" in group else str(len(group["gpus"])) for group in groups)
            + f" at {run.rate_per_s:.4g}")


def t1(effort: Effort) -> list[Row]:
    return [t1_row("T1", "local", effort, CPU_EXAMPLE, f"rnb-tune's verified best under p99 < {BOUND_MS:g} ms / the "
                    f"best of the measured grid ({SLOTS} CPU slots, config/tune-cpu-example.json: steps that compute "
                    "on the CPU)", Goal(">=", T1_GOAL))]


def t1s(effort: Effort) -> list[Row]:
    return [t1_row("T1s", "local", effort, EXAMPLE, f"T1 on steps that sleep ({SLOTS} CPU slots, "
                    "config/tune-example.json)", Goal(">=", T1_GOAL))]


def t2(effort: Effort, config: Path = CPU_EXAMPLE) -> list[Row]:
    """The quick tuner's wall time against the whole grid's, the grid T1 measures first (its repetition 0)."""
    quick_run = tuned_run("local", "quick", effort.quick, config, 0)
    grid_seconds, rates, _ = _grid("local", effort.quick, config, None, 0, frozenset())
    what = ("wall time of rnb-tune --search quick (profiling included) / of measuring the whole grid "
            f"({config.relative_to(REPO)})")
    if not quick_run.found:
        return [Row("T2", what, Goal("<=", 0.25), note=(
            f"the quick tuner exited {quick_run.returncode} with {quick_run.rate_per_s:.4g} req/s: it found and "
            "verified no configuration, so its wall time counts for nothing"))]
    return [Row("T2", what, Goal("<=", 0.25), Side("tuner (quick)", "s", quick_run.seconds),
                Side("grid", "s", grid_seconds), quick_run.seconds / grid_seconds, reps=1,
                note=f"one run each; the grid is {len(rates)} points; the quick tuner found "
                     f"{_chosen(quick_run)} req/s")]
