"""MLPerf LoadGen's rules for a run of one of its scenarios, as LoadGen's own source defines them.

LoadGen (mlcommons/inference, loadgen/results.cc and early_stopping.cc,
version 6.0.17) calls a performance run VALID when every rule that applies
to its scenario holds, and its summary names each with yes or no:

- min duration: Offline, the last completion at least min_duration after
  the start; Server, the last query scheduled at least min_duration after
  the first; SingleStream and MultiStream, the last query issued that late;
- min queries: every query asked for was issued (and completed), which a
  run only misses when it ended early;
- performance constraints (Server only): the p-th percentile latency, the
  sorted latencies' element at floor(n p), at most the target latency;
- early stopping (all but Offline): with confidence 0.99, the run's
  queries bound the scenario's percentile.  For t queries over the target
  among n, the run passes when n >= h + t, h being the fewest queries
  under the target for which t or fewer over it would happen with
  probability at most 0.01 if the true quantile were at the target: the
  binomial tail P(Binomial(h + t, 1 - p) <= t) <= 0.01.  Server counts t
  against its target latency; SingleStream and MultiStream need the h for
  one query over (64 queries at the 90th percentile, 662 at the 99th)
  and estimate the percentile as the t-th slowest latency, t the largest
  count the run's queries could have passed with.

Here the samples are RnB's items: each one's issue is its due time where
its card records one (LoadGen times a Server query from its schedule, an
Offline one from the start), else its enqueue, and its completion its final
step's hand-over.  A MultiStream query is the items
issued together (item ids `q * N` to `q * N + N - 1`), and its latency is
from its first issue to its last completion, as LoadGen times a query.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from rnb.core.records import JsonObject
from rnb.load import Scenario

EARLY_STOPPING_CONFIDENCE = 0.99   # LoadGen's, fixed in results.cc


@dataclass(frozen=True)
class RuleSettings:
    """What LoadGen judges one run against: its scenario and the settings RnB passes to it (or would)."""

    scenario: Scenario
    min_duration_s: float
    queries: int                      # queries asked for: LoadGen's min_query_count (and max_query_count)
    samples_per_query: int = 1        # MultiStream's; 1 elsewhere
    target_latency_s: float | None = None   # Server's bound


@dataclass(frozen=True)
class Samples:
    """A run's samples in the order they were issued: when each was issued and when it completed (seconds)."""

    issued: np.ndarray
    completed: np.ndarray
    item_ids: np.ndarray


@dataclass(frozen=True)
class Rule:
    """One of LoadGen's rules for one run: its name as LoadGen's summary prints it, whether it held, and why not."""

    name: str
    met: bool
    why: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {'yes' if self.met else 'no'}" + (f", {self.why}" if self.why else "")


@dataclass(frozen=True)
class Verdict:
    """A run judged by LoadGen's rules for its scenario: each rule, and the scenario's result figures."""

    scenario: str
    rules: tuple[Rule, ...]
    result: tuple[tuple[str, float], ...]   # the figures LoadGen's summary leads with, by name (ms or per second)

    @property
    def valid(self) -> bool:
        return all(rule.met for rule in self.rules)

    def rules_text(self) -> str:
        """Each rule with yes or no, as LoadGen's summary names them: `min duration satisfied: yes; ...`."""
        return "; ".join(str(rule) for rule in self.rules)

    def failures(self) -> str:
        """The rules that failed, as an INVALID job's reason: `by LoadGen's server rules: early stopping ...: no, ...`."""
        return f"by LoadGen's {self.scenario} rules: " + "; ".join(str(rule) for rule in self.rules if not rule.met) + "."

    def to_json(self) -> JsonObject:
        """meta.json's `loadgen_rules`: the scenario, VALID or not, each rule with whether it held and why not, and
        the result's figures."""
        return {"scenario": self.scenario, "valid": self.valid,
                "rules": [{"rule": rule.name, "met": rule.met, "why": rule.why} for rule in self.rules],
                "result": dict(self.result)}


def judge(settings: RuleSettings, samples: Samples, issued: int | None = None) -> Verdict:
    """The run's verdict by LoadGen's rules for its scenario; `issued` counts the queries the run issued and
    completed (default: those among `samples`, which may leave out a warm-up)."""
    spec = settings.scenario
    latencies = query_latencies(samples, settings.samples_per_query)
    issued = latencies.size if issued is None else issued
    rules = [min_duration(spec.name, samples, settings.min_duration_s), min_queries(settings, issued)]
    if spec.name == "server":
        rules.append(performance_constraints(latencies, spec.percentile, settings.target_latency_s or 0.0))
    rules.append(early_stopping(spec.name, latencies, spec.percentile, settings.target_latency_s))
    # LoadGen's summary puts the performance constraints first.
    rules.sort(key=lambda rule: rule.name != PERFORMANCE)
    return Verdict(spec.name, tuple(rules), result_figures(spec, samples, latencies))


MIN_DURATION, MIN_QUERIES, PERFORMANCE, EARLY_STOPPING = (
    "min duration satisfied", "min queries satisfied", "performance constraints satisfied", "early stopping satisfied")


def min_duration(scenario: str, samples: Samples, min_duration_s: float) -> Rule:
    """Offline: the last completion after the start; the others: the last query issued (Server: scheduled) after it."""
    if samples.issued.size == 0:
        return Rule(MIN_DURATION, True) if min_duration_s <= 0 else Rule(MIN_DURATION, False, "no query was issued")
    start = float(samples.issued.min())
    end = float(samples.completed.max() if scenario == "offline" else samples.issued.max())
    what = "the last sample completed" if scenario == "offline" else "the last query was issued"
    if end - start >= min_duration_s:
        return Rule(MIN_DURATION, True)
    return Rule(MIN_DURATION, False, f"{what} {end - start:.3f} s after the start, under {min_duration_s:g} s")


def min_queries(settings: RuleSettings, issued: int) -> Rule:
    """Every query asked for was issued: a run misses it only by ending early."""
    if issued >= settings.queries:
        return Rule(MIN_QUERIES, True)
    return Rule(MIN_QUERIES, False, f"{issued} of the {settings.queries} queries asked for were issued and completed")


def performance_constraints(latencies: np.ndarray, percentile: float, target_s: float) -> Rule:
    """Server: the percentile's latency, LoadGen's element floor(n p) of the sorted latencies, within the target."""
    if latencies.size == 0:
        return Rule(PERFORMANCE, False, "no query completed")
    value = loadgen_percentile(latencies, percentile)
    if value <= target_s:
        return Rule(PERFORMANCE, True)
    return Rule(PERFORMANCE, False, f"{_nth(percentile)} percentile latency {value * 1000:.2f} ms over the "
                                    f"{target_s * 1000:g} ms target")


def early_stopping(scenario: str, latencies: np.ndarray, percentile: float, target_s: float | None) -> Rule:
    """Whether the run's queries bound the scenario's percentile with LoadGen's confidence (Offline: always)."""
    n = latencies.size
    if scenario == "offline":
        return Rule(EARLY_STOPPING, True)
    if scenario == "server":
        over = int(np.count_nonzero(latencies > (target_s or 0.0)))
        needed = min_passing(over, percentile) + over
    else:
        needed = min_passing(1, percentile) + 1
    if n >= needed:
        return Rule(EARLY_STOPPING, True)
    return Rule(EARLY_STOPPING, False, f"{needed - n} more queries needed")


def result_figures(spec: Scenario, samples: Samples, latencies: np.ndarray) -> tuple[tuple[str, float], ...]:
    """What LoadGen's summary leads with for the scenario: samples per second, or the percentile's latency (ms)."""
    if latencies.size == 0:
        return ()
    start = float(samples.issued.min())
    percentile = (f"{_nth(spec.percentile)} percentile latency ms", loadgen_percentile(latencies, spec.percentile) * 1000)
    if spec.name == "offline":
        return (("samples per second", samples.issued.size / (float(samples.completed.max()) - start)),)
    if spec.name == "server":
        last = int(np.argmax(samples.issued))
        return (("completed samples per second", (samples.issued.size - 1) / (float(samples.completed[last]) - start)),
                percentile)
    estimate = early_stopping_estimate(latencies, spec.percentile)
    return (percentile,) + (() if estimate is None else (
        (f"early stopping {_nth(spec.percentile)} percentile estimate ms", estimate * 1000),))


def query_latencies(samples: Samples, samples_per_query: int) -> np.ndarray:
    """Each query's latency (s): a sample's own, or a MultiStream query's from its first issue to its last completion.

    A query some of whose samples are not among `samples` (left to warm-up) is left out.
    """
    if samples_per_query == 1 or samples.issued.size == 0:
        return samples.completed - samples.issued
    query = samples.item_ids // samples_per_query
    order = np.argsort(query, kind="stable")
    query, issued, completed = query[order], samples.issued[order], samples.completed[order]
    starts = np.flatnonzero(np.r_[True, query[1:] != query[:-1]])
    sizes = np.diff(np.r_[starts, query.size])
    whole = sizes == samples_per_query
    first, last = np.minimum.reduceat(issued, starts), np.maximum.reduceat(completed, starts)
    return (last - first)[whole]


def loadgen_percentile(latencies: np.ndarray, percentile: float) -> float:
    """LoadGen's percentile: the sorted latencies' element at floor(n p), no interpolation."""
    ordered = np.sort(latencies)
    return float(ordered[min(int(ordered.size * percentile), ordered.size - 1)])


def early_stopping_estimate(latencies: np.ndarray, percentile: float) -> float | None:
    """SingleStream's and MultiStream's estimate of the percentile: the t-th slowest latency, t the most queries
    over it that the run's queries could pass early stopping with; None when they cannot pass it at all."""
    n = latencies.size
    if n < min_passing(1, percentile) + 1:
        return None
    low, high = 1, n   # the largest t with n >= min_passing(t) + t, which grows with t
    while low < high:
        middle = (low + high + 1) // 2
        if n >= min_passing(middle, percentile) + middle:
            low = middle
        else:
            high = middle - 1
    return float(np.sort(latencies)[n - low])


@functools.lru_cache(maxsize=4096)
def min_passing(over: int, percentile: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> int:
    """The fewest queries under the target, h, for which `over` or fewer over it among h + over would happen with
    probability at most 1 - confidence if the percentile were at the target (LoadGen's MinPassingQueriesFinder)."""
    def passes(h: int) -> bool:
        return binomial_at_most(over, h + over, 1.0 - percentile) <= 1.0 - confidence
    high = 1
    while not passes(high):
        high *= 2
    low = high // 2
    while low < high:   # the smallest passing h in (high / 2, high]
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle + 1
    return low


def binomial_at_most(k: int, n: int, q: float) -> float:
    """P(X <= k) for X ~ Binomial(n, q), summed in log space so that large n does not underflow."""
    if k >= n:
        return 1.0
    x = np.arange(k + 1)
    log_terms = (_log_factorial(n) - _log_factorials(x) - _log_factorials(n - x)
                 + x * math.log(q) + (n - x) * math.log1p(-q))
    top = float(log_terms.max())
    return min(1.0, math.exp(top) * float(np.exp(log_terms - top).sum()))


def _log_factorial(n: int) -> float:
    return math.lgamma(n + 1)


def _log_factorials(values: np.ndarray) -> np.ndarray:
    return np.array([math.lgamma(v + 1) for v in values.tolist()])


def _nth(percentile: float) -> str:
    """`99th`, `90th`, `99.9th`: a percentile as LoadGen's summary names it."""
    return f"{percentile * 100:g}th"
