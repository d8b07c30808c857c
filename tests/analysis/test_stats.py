"""Order-statistic percentile bounds, windowed throughput and the steady state, against hand-worked values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rnb.analysis.stats import (
    ThroughputSeries,
    binomial_cdf,
    min_items_for_upper_bound,
    order_statistic_ranks,
    percentile_bounds,
    steady_state,
    window_count,
    windowed_throughput,
)


def test_binomial_cdf_matches_the_sum_of_exact_terms() -> None:
    n, p = 30, 0.9
    exact = np.cumsum([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])
    assert binomial_cdf(n, p) == pytest.approx(exact, abs=1e-12)


def test_ranks_are_the_textbook_ones_and_cover_at_least_the_confidence() -> None:
    assert order_statistic_ranks(100, 50.0) == (40, 61)       # the median's 95% interval from 100 values
    for n, q in ((368, 99.0), (1000, 99.0), (500, 90.0), (5000, 99.9)):
        low, high = order_statistic_ranks(n, q)
        cdf = binomial_cdf(n, q / 100)
        assert cdf[high - 1] - cdf[low - 1] >= 0.95                    # P(low <= B <= high - 1)
        assert cdf[low - 1] <= 0.025 < cdf[low] and cdf[high - 2] < 0.975 <= cdf[high - 1]


def test_the_p99_needs_368_items_for_an_upper_bound() -> None:
    assert min_items_for_upper_bound(99.0) == 368 and 0.99**368 <= 0.025 < 0.99**367
    assert order_statistic_ranks(367, 99.0)[1] is None
    assert order_statistic_ranks(368, 99.0)[1] == 368
    assert min_items_for_upper_bound(99.9) == 3688


def test_percentile_bounds_are_order_statistics_of_the_values() -> None:
    values = np.array([float(v) for v in range(1000, 0, -1)] + [np.nan])   # 1..1000 shuffled order, one missing
    bounds = percentile_bounds(values, 99.0)
    assert (bounds.value, bounds.low, bounds.high) == (pytest.approx(990.01), 983.0, 997.0)
    assert percentile_bounds(np.array([np.nan]), 99.0) is None
    short = percentile_bounds(np.arange(1.0, 101.0), 99.0)
    assert short.high is None and short.low == 97.0   # P(B <= 96) = 0.018 <= 0.025 < P(B <= 97) = 0.079


def test_throughput_windows_count_finishes_per_second() -> None:
    finishes = np.array([0.1, 0.2, 0.3, 1.5, 2.2, 2.4, 2.6, 2.8, np.nan])
    series = windowed_throughput(finishes, 0.0, 3.0, windows=3)
    assert series.window_s == 1.0 and series.starts_s.tolist() == [0.0, 1.0, 2.0]
    assert series.rates.tolist() == [3.0, 1.0, 4.0]
    assert [window_count(n) for n in (0, 299, 300, 1999, 5000)] == [3, 3, 3, 19, 20]


def test_steady_state_is_the_longest_run_near_the_median() -> None:
    rates = np.array([10.0, 95.0, 100.0, 104.0, 30.0, 100.0, 98.0, 50.0])
    steady = steady_state(ThroughputSeries(0.5, np.arange(8) * 0.5, rates))
    assert (steady.start_s, steady.end_s, steady.windows) == (0.5, 2.0, 3)
    assert steady.throughput == pytest.approx(299.0 / 3)
    assert steady_state(ThroughputSeries(1.0, np.arange(3.0), np.array([0.0, 0.0, 5.0]))) is None
    assert steady_state(ThroughputSeries(1.0, np.arange(2.0), np.array([10.0, 100.0]))) is None
