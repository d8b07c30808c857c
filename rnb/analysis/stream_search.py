"""How many camera streams at F fps a pipeline sustains: a search over N on VALID jobs, as the rate search is.

A stream count passes when its job completed and VALID with at most a
given fraction of its frames missed (late, and under the drop policy also
dropped: rnb.analysis.streams.missed_fraction), and, if a latency bound is
given, its end-to-end percentile under it.  The search doubles N from 1
until a count fails, then bisects between the last that passed and the
first that failed; like the rate search, it assumes that more streams never
miss less, and answers with two measured counts.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rnb.analysis.jobs import ValidityRules, e2e_percentile_ms
from rnb.analysis.streams import missed_fraction
from rnb.analysis.sweep import RunOutcome, run_valid


@dataclass(frozen=True)
class StreamTrial:
    """One measured stream count: the fraction of its frames missed and its latency percentile."""

    streams: int
    missed_fraction: float   # 1.0 when the job missed its target
    latency_ms: float        # inf when the job missed its target
    job_dir: Path


@dataclass(frozen=True)
class StreamSearch:
    best: int                        # the most streams that passed; 0 when even one failed
    above: int | None                # the fewest that failed; None when the largest searched passed
    trials: tuple[StreamTrial, ...]  # in the order they ran


def measure_streams(run: Callable[[int, int | None], RunOutcome], streams: int, percentile: float,
                    rules: ValidityRules, max_reruns: int) -> StreamTrial:
    """A trial of `streams` streams from a VALID job (run_valid); `run` takes the count and a longer run's -v."""
    job, complete = run_valid(lambda videos: run(streams, videos), f"--streams {streams}", rules, max_reruns)
    missed = missed_fraction(job.meta.streams or {}) if complete else None
    latency = e2e_percentile_ms(job, percentile) if complete else math.inf
    return StreamTrial(streams, 1.0 if missed is None else missed, latency, job.path)


def search_streams(measure: Callable[[int], StreamTrial], passes: Callable[[StreamTrial], bool],
                   max_streams: int) -> StreamSearch:
    """The most streams, up to `max_streams`, that pass: doubling from 1, then bisection."""
    trials: dict[int, StreamTrial] = {}

    def passed(streams: int) -> bool:
        if streams not in trials:
            trials[streams] = measure(streams)
        return passes(trials[streams])

    best, above = most_passing(passed, max_streams)
    return StreamSearch(best, above, tuple(trials.values()))


def most_passing(passed: Callable[[int], bool], most: int) -> tuple[int, int | None]:
    """The largest count up to `most` that passes, and the smallest that failed (None if `most` passed): doubling
    from 1, then bisection, so that the tuner's predictions and the measured search try the same counts."""
    best, above, count = 0, None, 1
    while above is None and best < most:
        if passed(count):
            best, count = count, min(2 * count, most)
        else:
            above = count
    while above is not None and above - best > 1:
        middle = (best + above) // 2
        best, above = (middle, above) if passed(middle) else (best, middle)
    return best, above


def format_stream_search(result: StreamSearch, fps: float, fraction: float, bound_ms: float | None,
                         percentile: float) -> str:
    """The trials in order, then the answer with the count that bracketed it."""
    def describe(trial: StreamTrial) -> str:
        if math.isinf(trial.latency_ms):
            return f"{trial.streams} streams: target not reached"
        return f"{trial.streams} streams: {trial.missed_fraction:.1%} missed, p{percentile:g} {trial.latency_ms:.2f} ms"

    lines = [f"trial {i}: {describe(trial)}" for i, trial in enumerate(result.trials, start=1)]
    rule = f"at most {fraction:.1%} of frames missed" + (f" and p{percentile:g} < {bound_ms:g} ms" if bound_ms else "")
    if result.best == 0:
        lines.append(f"no stream count at {fps:g} fps keeps {rule}: even 1 does not.")
    elif result.above is None:
        lines.append(f"streams at {fps:g} fps keeping {rule}: {result.best}, the most searched; search higher.")
    else:
        lines.append(f"streams at {fps:g} fps keeping {rule}: {result.best} (and not {result.above})")
    return "\n".join(lines)
