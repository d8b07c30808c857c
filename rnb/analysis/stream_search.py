"""How many camera streams at F fps a pipeline sustains: a search over N on VALID jobs, as the rate search is.

A stream count passes when its job completed and VALID with at most a
given fraction of its frames missed (late, and under the drop policy also
dropped: rnb.analysis.streams.missed_fraction), and, if a latency bound is
given, its end-to-end percentile under it.  The search doubles N from 1
until a count fails, then bisects between the last that passed and the
first that failed; like the rate search, it assumes that more streams never
miss less, and answers with two measured counts.

Each trial names its bound (rnb.analysis.bound): its busiest step, how
busy, and who missed its frames.  A count that failed with every step
mostly idle was failed by a host stall, not the pipeline: it runs again,
up to HOST_STALL_REPEATS jobs, and their majority decides it, as the
rate tuner's --verify-repeats does.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rnb.analysis.bound import JobBound
from rnb.analysis.jobs import ValidityRules, e2e_percentile_ms, summarize_job
from rnb.analysis.streams import missed_fraction
from rnb.analysis.sweep import RunOutcome, run_valid

log = logging.getLogger(__name__)

# Jobs a count failed by a host stall may run, their majority deciding it (2 of 3 agreeing end it).
HOST_STALL_REPEATS = 3


@dataclass(frozen=True)
class StreamTrial:
    """One measured stream count: the fraction of its frames missed and its latency percentile."""

    streams: int
    missed_fraction: float   # 1.0 when the job missed its target
    latency_ms: float        # inf when the job missed its target
    job_dir: Path
    bound: JobBound | None = None   # its busiest step and who missed its frames; None where nothing was measured
    runs: tuple[Path, ...] = ()     # every job at this count, where a host stall ran it again (this one among them)

    @property
    def host_stall(self) -> bool:
        return self.bound is not None and self.bound.host_stall

    @property
    def job_dirs(self) -> tuple[Path, ...]:
        return self.runs or (self.job_dir,)


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
    bound = JobBound.of(summarize_job(job, rules))
    return StreamTrial(streams, 1.0 if missed is None else missed, latency, job.path, bound)


def search_streams(measure: Callable[[int], StreamTrial], passes: Callable[[StreamTrial], bool],
                   max_streams: int) -> StreamSearch:
    """The most streams, up to `max_streams`, that pass: doubling from 1, then bisection."""
    trials: dict[int, StreamTrial] = {}

    def passed(streams: int) -> bool:
        if streams not in trials:
            trials[streams] = settled(measure, passes, streams)
        return passes(trials[streams])

    best, above = most_passing(passed, max_streams)
    return StreamSearch(best, above, tuple(trials.values()))


def settled(measure: Callable[[int], StreamTrial], passes: Callable[[StreamTrial], bool], streams: int,
            repeats: int = HOST_STALL_REPEATS) -> StreamTrial:
    """A count's trial; one that a host stall failed runs again until `repeats` jobs' majority decides, and the
    count's trial is then the last job of the majority, holding every job's directory."""
    runs = [measure(streams)]
    if passes(runs[0]) or not runs[0].host_stall:
        return runs[0]
    while (len(runs) < repeats and max(ayes := sum(map(passes, runs)), len(runs) - ayes) <= repeats // 2):
        log.info("%s: %d of %d jobs passed, the others missed frames in a host stall (%s); running the count "
                 "again, %d of up to %d", counted(streams), ayes, len(runs), runs[0].job_dir.name, len(runs) + 1,
                 repeats)
        runs.append(measure(streams))
    majority = [run for run in runs if passes(run) == (2 * sum(map(passes, runs)) > len(runs))]
    return dataclasses.replace(majority[-1], runs=tuple(run.job_dir for run in runs))


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
    """The trials in order, each with its bound, then the answer with the count that bracketed it and what bounds it."""
    lines = [f"trial {i}: {describe(trial, percentile)}" for i, trial in enumerate(result.trials, start=1)]
    rule = f"at most {fraction:.1%} of frames missed" + (f" and p{percentile:g} < {bound_ms:g} ms" if bound_ms else "")
    if result.best == 0:
        lines.append(f"no stream count at {fps:g} fps keeps {rule}: even 1 does not.")
    elif result.above is None:
        lines.append(f"streams at {fps:g} fps keeping {rule}: {result.best}, the most searched; search higher.")
    else:
        lines.append(f"streams at {fps:g} fps keeping {rule}: {result.best} (and not {result.above})")
    lines.append(bound_sentence(result))
    return "\n".join(lines)


def describe(trial: StreamTrial, percentile: float) -> str:
    """One trial: its frames missed and latency, its busiest step, and how many jobs decided it."""
    if math.isinf(trial.latency_ms):
        text = f"{counted(trial.streams)}: target not reached"
    else:
        text = f"{counted(trial.streams)}: {trial.missed_fraction:.1%} missed, p{percentile:g} {trial.latency_ms:.2f} ms"
    if trial.bound is not None:
        text += f"; {trial.bound.trial_words()}"
    if len(trial.job_dirs) > 1:
        text += f" (the majority of {len(trial.job_dirs)} jobs, run again after a host stall)"
    return text


def counted(streams: int) -> str:
    """`1 stream`, `2 streams`."""
    return f"{streams} stream{'' if streams == 1 else 's'}"


def bound_sentence(result: StreamSearch) -> str:
    """What bounds the answer: the first count that failed (or, where none did, the most that passed), its busiest
    step, and whether the pipeline or the host missed its frames."""
    trials = {trial.streams: trial for trial in result.trials}
    failed = trials.get(result.above) if result.above is not None else None
    at = failed if failed is not None else trials.get(result.best)
    if at is None or at.bound is None or at.bound.busy is None:
        return "what bounds it: no runner's work was measured, so nothing names a step."
    where = f"at {counted(at.streams)} {at.bound.busiest} was busy {at.bound.busy:.0%}"
    if failed is None:
        return f"what bounds it: {where}, the most searched, and missed no more than the bound."
    if at.host_stall:
        votes = f" in the majority of {len(at.job_dirs)} jobs" if len(at.job_dirs) > 1 else ""
        return (f"what bounds it: {where}, not saturated, when its frames were missed{votes}: the host, not the "
                "pipeline, missed them; run the search on a quieter host.")
    if at.bound.saturated and at.bound.starved:
        return (f"what bounds it: {where}, saturated, though its runners waited for a core {at.bound.waited:.0%} of "
                "the time: the host's cores (the pipeline's own CPU, or other work on the host), not the step alone, "
                "missed the frames.")
    if at.bound.saturated:
        return f"what bounds it: {where}, saturated: the pipeline, not the host, missed the frames."
    return f"what bounds it: {where}: {at.bound.trial_words().partition(': ')[2] or 'its frames were missed'}."
