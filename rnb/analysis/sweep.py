"""Load sweeps: run the benchmark at several request rates, and search for the peak rate under a latency bound.

The search is perf_analyzer's latency threshold / LoadGen's peak-performance
mode: bisection over the Poisson request rate (1000 / -mi requests per
second). A measurement is one whole benchmark job, so the number of steps is
bounded and every reported rate is one that was actually measured.
"""
from __future__ import annotations

import logging
import math
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rnb.analysis.job_dirs import Job, read_job
from rnb.analysis.jobs import BOUNDED_PERCENTILE, ValidityRules, e2e_percentile_ms, measured_rows, measured_window
from rnb.analysis.stats import min_items_for_upper_bound
from rnb.core.termination import COMPLETE_REASONS

log = logging.getLogger(__name__)

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark.py"
INTERRUPT_GRACE_S = 30.0


class SweepError(RuntimeError):
    """A benchmark run the sweep cannot use (bad config, no job log, interrupted); one sentence."""


@dataclass(frozen=True)
class RunOutcome:
    job_dir: Path
    returncode: int


@dataclass(frozen=True)
class Trial:
    """One measured load: its rate, and its latency percentile (inf when the job missed its target)."""

    rate_per_s: float
    latency_ms: float
    job_dir: Path | None = None

    @property
    def mean_interval_ms(self) -> float:
        return 1000.0 / self.rate_per_s


@dataclass(frozen=True)
class BisectionResult:
    bound_ms: float
    best: Trial | None      # highest measured rate under the bound; None if even the lowest failed
    above: Trial | None     # lowest measured rate above `best` that broke the bound; None if the highest passed
    trials: tuple[Trial, ...]


def format_interval(mean_interval_ms: float) -> str:
    """-mi as the benchmark receives it: short, but exact enough that rates do not collide."""
    return f"{mean_interval_ms:.6g}"


def run_benchmark(
    config: str,
    mean_interval_ms: float,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    benchmark: Path = BENCHMARK,
    timeout_s: float | None = None,
    output: IO[str] | None = None,
    load: Sequence[str] | None = None,
) -> RunOutcome:
    """Run one benchmark job in a child interpreter and return the job directory it created.

    The load is `-mi mean_interval_ms`, or the flags `load` gives instead
    (`--streams 4 --fps 30`).  The job is found as the one new directory
    under `log_dir`, so two sweeps must not share a log directory at the
    same time. A failed job (exit 1) still has a log and is returned;
    anything else non-zero stops the sweep.  The child's stdout and stderr
    go to `output` when given (a tool with progress bars keeps them off the
    terminal), else its stdout to stderr.
    """
    load_args = list(load) if load is not None else ["-mi", format_interval(mean_interval_ms)]
    at = " ".join(load_args)
    log_dir.mkdir(parents=True, exist_ok=True)
    before = {path.name for path in log_dir.iterdir()}
    command = [sys.executable, str(benchmark), "-c", config, *load_args, "--log-dir", str(log_dir), *extra_args]
    # The run's own summary goes to stderr so that the sweep's stdout is only its comparison.
    child = subprocess.Popen(command, stdout=sys.stderr.fileno() if output is None else output,
                             stderr=None if output is None else subprocess.STDOUT)
    try:
        returncode = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _interrupt(child)
        raise SweepError(f"{benchmark} {at} ran past {timeout_s:g} s and was stopped.") from None
    except KeyboardInterrupt:
        _interrupt(child)   # a Ctrl-C that reached this process alone must still stop the job, which keeps its log
        raise
    if returncode not in (0, 1):
        raise SweepError(f"{benchmark} -c {config} {at} exited with {returncode}.")
    new = sorted(path for path in log_dir.iterdir() if path.name not in before and path.is_dir())
    if len(new) != 1:
        raise SweepError(f"{log_dir}: expected one new job directory after the run at {at}, found {len(new)}.")
    return RunOutcome(new[0], returncode)


def _interrupt(child: subprocess.Popen[bytes]) -> None:
    """SIGINT lets the benchmark stop its own processes and write its log; past the grace it is killed."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def measure_trial(outcome: RunOutcome, rate_per_s: float, percentile: float) -> Trial:
    return Trial(rate_per_s, e2e_percentile_ms(read_job(outcome.job_dir), percentile), outcome.job_dir)


def longer_run(videos: int, warmup: int, duration_s: float, rules: ValidityRules) -> int:
    """-v for a re-run of a job that was too short: at least double, enough items and long enough."""
    needed = max(rules.min_items, min_items_for_upper_bound(BOUNDED_PERCENTILE, rules.confidence)) + warmup
    stretched = math.ceil(videos * 1.25 * rules.min_duration_s / duration_s) if duration_s > 0 else 0
    return max(2 * videos, needed, stretched)


def measure_valid(run: Callable[[float, int | None], RunOutcome], rate_per_s: float, percentile: float,
                  rules: ValidityRules, max_reruns: int) -> Trial:
    """A trial from a VALID job only (run_valid); a job that missed its target has an infinite latency."""
    mean_interval_ms = 1000.0 / rate_per_s
    job, complete = run_valid(lambda videos: run(mean_interval_ms, videos), f"-mi {format_interval(mean_interval_ms)}",
                              rules, max_reruns)
    return Trial(rate_per_s, e2e_percentile_ms(job, percentile) if complete else math.inf, job.path)


def run_valid(run: Callable[[int | None], RunOutcome], load: str, rules: ValidityRules, max_reruns: int) -> tuple[Job, bool]:
    """One load's job, VALID: a job too short to be VALID is not a measurement, so it runs again longer.

    Returns the job and whether it completed.  A job that missed its target
    (a queue full, a process failed, a stall) is a measurement: the load
    was more than the pipeline could take; so is one whose queue grew
    (overloaded), by its own latencies.  A job still too short after
    `max_reruns` longer runs stops the sweep, rather than let an unmeasured
    load decide it.  `run` takes the -v of a longer run (None: the first).
    """
    videos: int | None = None
    invalid = ""   # why the last run was INVALID
    for _ in range(max_reruns + 1):
        outcome = run(videos)
        job = read_job(outcome.job_dir)
        if job.meta.termination_reason not in COMPLETE_REASONS:
            return job, False
        window = measured_window(job, measured_rows(job), rules)
        if window.invalid_because is None or window.overloaded:   # an overloaded job measured a load too heavy
            return job, True
        invalid = window.invalid_because
        videos = longer_run(job.meta.setting("videos", job.meta.finished_items), job.meta.setting("warmup", 0),
                            window.duration_s, rules)
        log.info("%s is INVALID (%s); running %s again with -v %d", job.job_id, invalid, load, videos)
    raise SweepError(f"{outcome.job_dir}: still INVALID after {max_reruns} longer runs at {load} "
                     f"({invalid.rstrip('.')}); give a larger -v.")


def bisect_rate(
    measure: Callable[[float], Trial],
    low_rate: float,
    high_rate: float,
    bound_ms: float,
    max_steps: int,
    rel_tol: float = 0.05,
) -> BisectionResult:
    """The highest rate in [low_rate, high_rate] whose latency stays under `bound_ms`.

    Measures both ends first; between a passing and a failing rate it halves
    the interval at most `max_steps` times, stopping early once the two are
    within `rel_tol` of each other. Latency need not be monotonic in rate, so
    the answer is a bracket of two measured loads, not a guarantee.
    """
    if not 0 < low_rate < high_rate:
        raise ValueError(f"the rates must satisfy 0 < low < high; got low {low_rate:g}, high {high_rate:g}.")
    if max_steps < 0:
        raise ValueError(f"max_steps must not be negative; got {max_steps}.")
    trials = [measure(low_rate)]
    low = trials[0]
    if not low.latency_ms < bound_ms:
        return BisectionResult(bound_ms, None, low, tuple(trials))
    trials.append(measure(high_rate))
    high = trials[-1]
    if high.latency_ms < bound_ms:
        return BisectionResult(bound_ms, high, None, tuple(trials))
    for _ in range(max_steps):
        if high.rate_per_s - low.rate_per_s <= rel_tol * high.rate_per_s:
            break
        trials.append(measure((low.rate_per_s + high.rate_per_s) / 2.0))
        if trials[-1].latency_ms < bound_ms:
            low = trials[-1]
        else:
            high = trials[-1]
    return BisectionResult(bound_ms, low, high, tuple(trials))


def format_bisection(result: BisectionResult, percentile: float) -> str:
    """The trials in order, then the answer with its bracketing measured loads."""
    def describe(trial: Trial) -> str:
        latency = "target not reached" if math.isinf(trial.latency_ms) else f"p{percentile:g} {trial.latency_ms:.2f} ms"
        return f"{trial.rate_per_s:.4g} req/s (-mi {format_interval(trial.mean_interval_ms)}): {latency}"

    lines = [f"trial {i}: {describe(trial)}" for i, trial in enumerate(result.trials, start=1)]
    bound = f"p{percentile:g} < {result.bound_ms:g} ms"
    match result.best, result.above:
        case None, Trial() as lowest:
            lines.append(f"no rate meets {bound}: even the lowest, {describe(lowest)}.")
        case Trial() as best, None:
            lines.append(f"the highest rate searched meets {bound}: {describe(best)}; search higher.")
        case Trial() as best, Trial() as above:
            lines.append(f"peak rate meeting {bound}: {describe(best)}")
            lines.append(f"  bracketed by the lowest failing load: {describe(above)}")
    return "\n".join(lines)
