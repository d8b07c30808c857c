"""Statistics a reviewer can check: percentile confidence intervals and the steady-state window.

A latency percentile from n items is itself an estimate. Its confidence
interval here comes from order statistics, as MLPerf LoadGen's early-stopping
rule reasons: if q is the true p-quantile, the number of items faster than q
is Binomial(n, p), so the k-th smallest latency lies below q with a
probability read off that binomial. No distribution is assumed. The upper
bound exists only when even the slowest item would be an unlikely place for
q to hide above, i.e. p**n <= (1 - confidence) / 2: for the p99 at 95%
confidence that takes 368 items, which is why fewer make a run INVALID.

Throughput over time is counted in equal windows of the job's elapsed time,
as many as give about a hundred items each (3 to 20), so that counting
noise (about 10%) stays well inside the tolerance; the steady state is the
longest run of consecutive windows whose rate stays within that tolerance
(20%) of the median window rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
STEADY_TOLERANCE = 0.2
MAX_WINDOWS = 20
ITEMS_PER_WINDOW = 100      # counting noise of a window is about 1/sqrt(items): 10% at 100


@dataclass(frozen=True)
class PercentileBounds:
    """A percentile estimate with the order statistics that bound it at some confidence."""

    percentile: float          # e.g. 99.0
    value: float               # numpy's linear interpolation, as in every other table
    low: float | None          # None: too few items to bound it from below
    high: float | None         # None: too few items to bound it from above
    confidence: float


@dataclass(frozen=True)
class ThroughputSeries:
    """Items finished per second in consecutive equal windows, starting at the job's start."""

    window_s: float
    starts_s: np.ndarray       # each window's start, seconds after the job's start
    rates: np.ndarray          # items finished in the window / window_s


@dataclass(frozen=True)
class SteadyState:
    """The longest stretch of windows whose throughput stays near the median window's."""

    start_s: float             # seconds after the job's start
    end_s: float
    throughput: float          # items/s over the stretch
    windows: int


def binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), computed in log space so large n does not underflow."""
    k = np.arange(n + 1)
    log_factorial = np.cumsum(np.log(np.maximum(np.arange(n + 1), 1)))
    log_pmf = log_factorial[n] - log_factorial[k] - log_factorial[n - k] + k * math.log(p) + (n - k) * math.log1p(-p)
    return np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)


def order_statistic_ranks(n: int, percentile: float, confidence: float = CONFIDENCE) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) with P(x_(l) <= q_p <= x_(u)) >= confidence; None where no rank qualifies.

    With B the count of items below the true quantile, x_(l) <= q_p exactly
    when B >= l and q_p <= x_(u) exactly when B <= u - 1; each tail gets half
    of 1 - confidence.
    """
    if n < 1 or not 0.0 < percentile < 100.0:
        raise ValueError(f"need n >= 1 items and a percentile strictly between 0 and 100; got n {n}, percentile {percentile:g}")
    cdf = binomial_cdf(n, percentile / 100.0)
    tail = (1.0 - confidence) / 2.0
    # l - 1 is the largest k with P(B <= k) <= tail; u - 1 the smallest with P(B <= k) >= 1 - tail.
    below = np.flatnonzero(cdf <= tail)
    above = np.flatnonzero(cdf >= 1.0 - tail)
    low = int(below[-1]) + 1 if below.size else None
    high = int(above[0]) + 1 if above.size and above[0] + 1 <= n else None
    return low, high


def min_items_for_upper_bound(percentile: float, confidence: float = CONFIDENCE) -> int:
    """The fewest items whose slowest one bounds the percentile from above: p**n <= (1 - confidence) / 2."""
    return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log(percentile / 100.0))


def percentile_bounds(values: np.ndarray, percentile: float, confidence: float = CONFIDENCE) -> PercentileBounds | None:
    """The percentile of the non-NaN values with its order-statistic interval; None when there are none."""
    values = np.sort(values[~np.isnan(values)])
    if values.size == 0:
        return None
    low, high = order_statistic_ranks(values.size, percentile, confidence)
    return PercentileBounds(
        percentile, float(np.percentile(values, percentile)),
        None if low is None else float(values[low - 1]), None if high is None else float(values[high - 1]),
        confidence)


def window_count(items: int) -> int:
    """How many windows to count `items` finished items in: about ITEMS_PER_WINDOW each, 3 to MAX_WINDOWS."""
    return int(np.clip(items // ITEMS_PER_WINDOW, 3, MAX_WINDOWS))


def windowed_throughput(finish_times: np.ndarray, start: float, end: float,
                        windows: int | None = None) -> ThroughputSeries:
    """Items finished in each of `windows` equal windows of [start, end) (default: window_count), as items/s."""
    windows = window_count(int(np.count_nonzero(~np.isnan(finish_times)))) if windows is None else windows
    if windows < 1 or not end > start:
        raise ValueError(f"need at least one window over a positive span; got {windows} windows over [{start}, {end})")
    width = (end - start) / windows
    counts, _ = np.histogram(finish_times[~np.isnan(finish_times)], bins=windows, range=(start, end))
    return ThroughputSeries(width, np.arange(windows) * width, counts / width)


def steady_state(series: ThroughputSeries, tolerance: float = STEADY_TOLERANCE) -> SteadyState | None:
    """The longest run of windows within `tolerance` of the median rate (the earliest among equals).

    None when no window is near the median (the median of an even count may
    fall between two far-apart rates) or the median rate is zero: a job that
    finished nothing in most of its windows reached no steady state.
    """
    reference = float(np.median(series.rates))
    if reference <= 0.0:
        return None
    near = np.abs(series.rates - reference) <= tolerance * reference
    best, best_start, run_start = 0, 0, 0
    for index, inside in enumerate(np.append(near, False)):
        if not inside:
            if index - run_start > best:
                best, best_start = index - run_start, run_start
            run_start = index + 1
    if best == 0:
        return None
    rates = series.rates[best_start: best_start + best]
    start_s = float(series.starts_s[best_start])
    return SteadyState(start_s, start_s + best * series.window_s, float(rates.mean()), best)
