"""Estimate: a discrete-event simulation of a whole candidate pipeline, fed by the profiles.

It follows what the harness does, event by event: the client's arrivals
(four kinds: Poisson, bulk, a closed loop, or the due times of a load's
trace, camera streams or schedule replayed), one FIFO queue per (step, out queue) from
which every replica of the groups reading it takes the oldest item when it
is free, each replica's calls (their occupancy sampled from the group's
profile at the candidate's form), the Batcher's policy (hand over at `batch`
items, or a partial batch once the input has been idle for a poll interval
and the first item has waited `timeout_ms`), segments (each split off and
selected on its own, merged where a step merges them), round-robin output
queue selection per replica, and back-pressure: a replica hands an output
on only into one of its own `num_shared_tensors` slots, and a slot is free
again once a consumer has taken the item off the queue.  Replicas that
share a GPU run their model calls one at a time on it (kernels of separate
processes are time-sliced, not overlapped).  The host's cores are shared by
processor sharing (rnb.tune.cores.SharedCores) among the calls computing on
them and the client's and main's work per item: a call's CPU seconds (its
profile's CPU fraction of its occupancy) stretch when more work computes
than the host has cores.  On Ray each pool of cores (one host, or the hosts
one node label spans: rnb.tune.hosts) is shared so on its own, with the CPU
that Ray's daemons spend per item and hop as background on the pool of the
hop's receiving end, and each actor call's CPU at both of its ends.  A hop
also takes time: an item reaches the next queue one hop's latency after its
hand-over (as profiled: the profiling job's hop into its sink, tenths of a
millisecond on the local engine, milliseconds on Ray), and on Ray the
producer's slot is free again only once the take has come back as the
call's reply, another hop later.

Why a small event loop of our own and not simpy: the model needs eight
kinds of event (an arrival, an item reaching a queue one hop after its
hand-over, a producer's slot freed by the reply, an idle Batcher's poll
timing out, a call wanting its GPU, the GPU finishing it, a call's end,
and the shared cores finishing a piece of CPU work) and no process
abstraction, and each candidate's peak rate takes a dozen simulations of a
few thousand items inside a search over many candidates.  A heap of plain
callbacks runs about 1 us per event, several times faster than simpy's
generator processes, and adds no dependency.

Its jobs live apart: rnb.tune.sim_records (the load, the pipeline as the
simulation sees it, the predictions), rnb.tune.sim_build (a candidate and
its profiles made into a SimPipeline), rnb.tune.simulation (the event
loop), and here the search of the peak rate and the Estimator that the
tuner's search consults.
"""
from __future__ import annotations

from collections.abc import Mapping

from rnb.analysis.sweep import Trial, bisect_rate
from rnb.tune.profile import Bench, Profile, ProfileKey
from rnb.tune.sim_build import pipeline_of
from rnb.tune.sim_records import DEFAULT_ITEMS, Arrivals, PeakEstimate, Prediction, SimPipeline
from rnb.tune.simulation import simulate
from rnb.tune.space import Candidate, TuneSpace

# Fractions of the capacity the peak search tries from the top down before it bisects: latency need not
# rise with the rate (a Batcher's partial batches wait for its timeout at low rates), so the search
# looks for the highest rate that meets the bound, not the lowest that breaks it.
SCAN_FRACTIONS: tuple[float, ...] = (0.98, 0.9, 0.8, 0.65, 0.5, 0.35, 0.2, 0.1, 0.05)


def peak_rate(pipeline: SimPipeline, bound_ms: float, percentile: float, items: int = DEFAULT_ITEMS, seed: int = 0,
              max_steps: int = 6, rel_tol: float = 0.02) -> PeakEstimate:
    """The highest Poisson rate whose predicted percentile stays under the bound.

    Rates are tried down from the capacity until one meets the bound; the
    sweep's own bisection (over simulations instead of jobs) then narrows
    the step between it and the failing rate above it.
    """
    capacity = pipeline.capacity_per_s()
    runs: dict[float, Prediction] = {}

    def measure(rate: float) -> Trial:
        if rate not in runs:
            runs[rate] = simulate(pipeline, Arrivals.poisson(rate), items, seed, (percentile,))
        return Trial(rate, runs[rate].percentile_ms(percentile))

    above = None
    for fraction in SCAN_FRACTIONS:
        rate = fraction * capacity
        if measure(rate).latency_ms < bound_ms:
            break
        above = rate
    else:
        return PeakEstimate(None, None, runs[min(runs)], capacity)
    if above is None:   # even 98% of the capacity meets the bound
        return PeakEstimate(rate, runs[rate], runs[min(runs)], capacity)
    result = bisect_rate(measure, rate, above, bound_ms, max_steps, rel_tol)
    best = result.best.rate_per_s if result.best is not None else rate
    return PeakEstimate(best, runs[best], runs[min(runs)], capacity)


class Estimator:
    """Predictions for the candidates of one space, each simulated once: what the search consults."""

    def __init__(self, space: TuneSpace, profiles: Mapping[ProfileKey, Profile], bench: Bench, bound_ms: float,
                 percentile: float, items: int = DEFAULT_ITEMS, seed: int = 0) -> None:
        self.space = space
        self.profiles = profiles
        self.bench = bench
        self.bound_ms = bound_ms
        self.percentile = percentile
        self.items = items
        self.seed = seed
        self._peaks: dict[Candidate, PeakEstimate] = {}

    def pipeline(self, candidate: Candidate) -> SimPipeline:
        return pipeline_of(self.space, candidate, self.profiles, self.bench)

    def peak(self, candidate: Candidate) -> PeakEstimate:
        if candidate not in self._peaks:
            self._peaks[candidate] = peak_rate(self.pipeline(candidate), self.bound_ms, self.percentile,
                                               self.items, self.seed)
        return self._peaks[candidate]

    def at(self, candidate: Candidate, arrivals: Arrivals, items: int | None = None,
           warmup: int | None = None) -> Prediction:
        """One simulation of a candidate; `items` and `warmup` as a job's -v and --warmup, to compare with it."""
        return simulate(self.pipeline(candidate), arrivals, items or self.items, self.seed, (self.percentile,), warmup)
