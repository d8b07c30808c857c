"""Verify: the finalists run for real, through the sweep, and only what they measure decides the winner.

Each finalist's config is written out and searched as `sweep.py
--latency-bound-ms` searches: bisection over the Poisson rate for the
highest rate whose percentile stays under the bound, VALID jobs only (a job
too short runs again longer; one that missed its target counts as over the
bound).  The search starts around the predicted peak: from 60% to 115% of
it, and goes lower (or higher) once if both ends fail (or pass).

On a host whose speed drifts (a shared VM: here one Ray job's p99 was 97
ms and the next one's, same config, rate and arrivals, 174 ms), one job
per rate lets a lucky or unlucky minute decide.  With `repeats` N a rate
runs up to N jobs and their majority decides, stopping as soon as it is
decided (two that agree of three); the rate's trial is its median job.

Every measured trial is written to DIR/verify/<candidate>/trials.json as it
lands, and the search consults that file before it runs a job, so a second
run with the same arguments, or one after a Ctrl-C, repeats no job that
finished.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rnb.analysis.jobs import BOUNDED_PERCENTILE, ValidityRules
from rnb.analysis.stats import min_items_for_upper_bound
from rnb.analysis.sweep import RunOutcome, Trial, bisect_rate, format_interval, measure_valid, run_benchmark
from rnb.engines.registry import DEFAULT_ENGINE
from rnb.tune.profile_cache import write_json_atomic
from rnb.tune.space import Candidate, TuneSpace, digest

LOW, HIGH = 0.6, 1.15            # the first bracket, as fractions of the predicted peak
LOWER, HIGHER = 0.2, 1.8         # the second, when the first's ends both fail or both pass


@dataclass(frozen=True)
class VerifySettings:
    """How finalists are measured; part of where their trials are kept, so a change measures again."""

    bound_ms: float
    percentile: float
    engine: str = DEFAULT_ENGINE
    max_steps: int = 3                       # bisection steps after the two ends
    seconds: float = 3.0                     # a job's -v: about this many seconds of requests at its rate
    warmup: int = 20
    rules: ValidityRules = ValidityRules()
    max_reruns: int = 3
    timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()         # more benchmark flags (e.g. --ray-address)
    repeats: int = 1                         # jobs per rate: their majority decides, their median is its trial

    @property
    def digest(self) -> str:
        return digest(self, 8)


@dataclass(frozen=True)
class Verified:
    """A finalist as measured: the peak rate that met the bound, the one above it that broke it, every trial."""

    candidate: Candidate
    config_path: Path
    trials: tuple[Trial, ...]
    best: Trial | None
    above: Trial | None

    @property
    def rate(self) -> float:
        return self.best.rate_per_s if self.best is not None else 0.0

    @property
    def resolution_per_s(self) -> float | None:
        """How well the peak is known: the gap between the rate that met the bound and the one that broke it
        (None where no rate tried broke it)."""
        if self.best is None or self.above is None:
            return None
        return self.above.rate_per_s - self.best.rate_per_s


def videos_for(rate_per_s: float, settings: VerifySettings) -> int:
    """-v of a verification job: enough items to be VALID, and about `seconds` of requests at its rate."""
    needed = max(settings.rules.min_items, min_items_for_upper_bound(BOUNDED_PERCENTILE, settings.rules.confidence))
    return max(needed + settings.warmup + 32, math.ceil(rate_per_s * settings.seconds) + settings.warmup)


class TrialLog:
    """DIR/verify/<candidate>-<settings>/trials.json: every job measured for one finalist, by its -mi."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.jobs: dict[str, list[Trial]] = {}
        if path.is_file():
            for row in json.loads(path.read_text()):
                latency = math.inf if row["latency_ms"] is None else float(row["latency_ms"])
                self.jobs.setdefault(row["mean_interval_ms"], []).append(
                    Trial(float(row["rate_per_s"]), latency, Path(row["job_dir"]) if row["job_dir"] else None))

    def get(self, rate_per_s: float) -> list[Trial]:
        return self.jobs.get(format_interval(1000.0 / rate_per_s), [])

    def add(self, trial: Trial) -> None:
        self.jobs.setdefault(format_interval(trial.mean_interval_ms), []).append(trial)
        write_json_atomic(self.path, [
            {"mean_interval_ms": mi, "rate_per_s": t.rate_per_s,
             "latency_ms": None if math.isinf(t.latency_ms) else t.latency_ms,
             "job_dir": None if t.job_dir is None else str(t.job_dir)} for mi, ts in self.jobs.items() for t in ts])


def decided(jobs: Sequence[Trial], repeats: int, bound_ms: float) -> bool:
    """Whether a rate's jobs settle it: `repeats` of them ran, or more than half of `repeats` agree."""
    passed = sum(job.latency_ms < bound_ms for job in jobs)
    return len(jobs) >= repeats or max(passed, len(jobs) - passed) > repeats // 2


def median_job(jobs: Sequence[Trial]) -> Trial:
    """A rate's trial: its median job by latency (of two, the slower), so its verdict is the majority's."""
    return sorted(jobs, key=lambda job: job.latency_ms)[len(jobs) // 2]


def verify(space: TuneSpace, candidate: Candidate, predicted_rate: float, root: Path, settings: VerifySettings,
           output: IO[str] | None = None, progress: Callable[[Trial], None] = lambda trial: None,
           widen: bool = True) -> Verified:
    """Measure one finalist's peak rate under the bound; `predicted_rate` sets where the search starts.

    `widen` False measures only the first bracket: for a candidate predicted
    to miss the bound at every rate, one job at its low end shows what it
    does (a slow rate would take long to fill a VALID job, for nothing).
    """
    where = root / "verify" / f"{candidate.key}-{settings.digest}"
    config_path = where / "config.json"
    write_json_atomic(config_path, space.document_for(candidate, description=f"rnb-tune finalist: {space.label(candidate)}"))
    trials = TrialLog(where / "trials.json")
    log_dir = root / "logs" / "verify"

    def run(mean_interval_ms: float, videos: int | None) -> RunOutcome:
        count = videos if videos is not None else videos_for(1000.0 / mean_interval_ms, settings)
        flags = ["-v", str(count), "--warmup", str(settings.warmup), "--engine", settings.engine, *settings.extra_args]
        return run_benchmark(str(config_path), mean_interval_ms, log_dir, flags, timeout_s=settings.timeout_s,
                             output=output)

    def measure(rate_per_s: float) -> Trial:
        jobs = list(trials.get(rate_per_s))
        while not jobs or not decided(jobs, settings.repeats, settings.bound_ms):
            job = measure_valid(run, rate_per_s, settings.percentile, settings.rules, settings.max_reruns)
            trials.add(job)
            jobs.append(job)
            progress(job)
        return median_job(jobs)

    def bracket(low: float, high: float) -> tuple[Trial | None, Trial | None, tuple[Trial, ...]]:
        result = bisect_rate(measure, low, high, settings.bound_ms, settings.max_steps)
        return result.best, result.above, result.trials

    peak = max(predicted_rate, 1e-3)
    best, above, seen = bracket(LOW * peak, HIGH * peak)
    if widen and best is None:
        best, above, more = bracket(LOWER * peak, LOW * peak)
        seen += more
    elif widen and above is None:
        best, above, more = bracket(HIGH * peak, HIGHER * peak)
        seen += more
    ordered = tuple(sorted({format_interval(t.mean_interval_ms): t for t in seen}.values(), key=lambda t: t.rate_per_s))
    return Verified(candidate, config_path, ordered, best, above)


def closest(verified: Sequence[Verified]) -> tuple[Verified, Trial] | None:
    """Among finalists none of which met the bound, the trial with the lowest measured latency."""
    trials = [(v, t) for v in verified for t in v.trials]
    return min(trials, key=lambda pair: pair[1].latency_ms) if trials else None
