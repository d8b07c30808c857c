"""LoadGen's rules for a scenario's run (rnb.analysis.loadgen_rules) and the overloaded verdict (rnb.analysis.verdict),
against cases worked by hand from LoadGen's definitions (loadgen/results.cc, early_stopping.cc)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from rnb.analysis.loadgen_rules import RuleSettings, Samples, judge, loadgen_percentile, min_passing, query_latencies
from rnb.analysis.verdict import overloaded
from rnb.load import SCENARIOS


def fewest_total(over: int, percentile: str) -> int:
    """By LoadGen's definition, exactly: the fewest queries n such that `over` or fewer of them over the target
    happen with probability <= 1 % when each is over with probability 1 - p (binomial, in fractions)."""
    p = Fraction(percentile)
    n = over + 1
    while sum(math.comb(n, x) * (1 - p) ** x * p ** (n - x) for x in range(over + 1)) > Fraction(1, 100):
        n += 1
    return n


@pytest.mark.parametrize(("over", "percentile", "total"), [
    (0, "0.99", 459),   # 0.99^458 = 0.01009 > 0.01 >= 0.99^459 = 0.00999
    (1, "0.99", 662),   # mlperf.conf's MultiStream min_query_count
    (1, "0.9", 64),     # SingleStream's "Processed at least 64 queries"
    (2, "0.99", 838),
    (7, "0.9", 156),
])
def test_early_stopping_needs_the_queries_the_binomial_tail_gives(over: int, percentile: str, total: int) -> None:
    assert fewest_total(over, percentile) == total   # the hand-worked figure, from the definition alone
    assert min_passing(over, float(percentile)) + over == total


def samples(latencies_s: list[float], gap_s: float = 0.01) -> Samples:
    issued = np.arange(len(latencies_s)) * gap_s
    return Samples(issued, issued + np.array(latencies_s), np.arange(len(latencies_s)))


SERVER = RuleSettings(SCENARIOS["server"], min_duration_s=1.0, queries=400, target_latency_s=0.1)


def test_a_server_run_of_400_queries_under_its_target_needs_59_more_for_early_stopping() -> None:
    verdict = judge(SERVER, samples([0.01] * 400))
    assert not verdict.valid
    assert verdict.rules_text() == ("performance constraints satisfied: yes; min duration satisfied: yes; "
                                    "min queries satisfied: yes; early stopping satisfied: no, 59 more queries needed")
    assert verdict.failures() == "by LoadGen's server rules: early stopping satisfied: no, 59 more queries needed."


def test_server_counts_the_queries_over_its_target_for_early_stopping_and_bounds_its_p99() -> None:
    # 3 of 1,000 over 100 ms: early stopping needs 3 + h queries, h from the tail with 3 over; the p99 is the
    # sorted latencies' element 990, under the target.
    latencies = [0.02] * 997 + [0.5] * 3
    verdict = judge(RuleSettings(SCENARIOS["server"], 1.0, 1000, target_latency_s=0.1), samples(latencies))
    rules = {rule.name: (rule.met, rule.why) for rule in verdict.rules}
    more = fewest_total(3, "0.99") - 1000
    assert rules["early stopping satisfied"] == (False, f"{more} more queries needed")
    assert rules["performance constraints satisfied"] == (True, "")
    assert dict(verdict.result)["99th percentile latency ms"] == pytest.approx(20.0)


def test_the_server_percentile_is_the_element_at_floor_n_p_and_equal_to_the_target_passes() -> None:
    # Of 1,000 latencies, sorted, element 990 is the p99: 9 over the target leave it under; 10 put it over.
    assert loadgen_percentile(np.array([0.05] * 991 + [0.2] * 9), 0.99) == 0.05
    assert loadgen_percentile(np.array([0.05] * 990 + [0.2] * 10), 0.99) == 0.2
    settings = RuleSettings(SCENARIOS["server"], 0.0, 1000, target_latency_s=0.1)
    over = judge(settings, samples([0.05] * 990 + [0.2] * 10)).rules[0]
    assert (over.name, over.met, over.why) == ("performance constraints satisfied", False,
                                               "99th percentile latency 200.00 ms over the 100 ms target")
    assert judge(settings, samples([0.1] * 1000, gap_s=0.0)).rules[0].met   # LoadGen fails only a latency above it


def test_single_stream_needs_64_queries_and_estimates_its_p90_from_the_slowest() -> None:
    settings = RuleSettings(SCENARIOS["single-stream"], 0.0, 63)
    assert judge(settings, samples([0.01] * 63)).rules[-1].why == "1 more queries needed"
    # 100 queries: the largest t with 100 >= h(t) + t is the estimate's rank from the top (LoadGen's loop).
    latencies = [0.001 * (i + 1) for i in range(100)]
    verdict = judge(RuleSettings(SCENARIOS["single-stream"], 0.0, 100), samples(latencies))
    t = 1
    while fewest_total(t + 1, "0.9") <= 100:
        t += 1
    figures = dict(verdict.result)
    assert t == 3 and verdict.valid and figures["early stopping 90th percentile estimate ms"] == pytest.approx(98.0)
    assert figures["90th percentile latency ms"] == pytest.approx(91.0)   # element 90 of 0..99


def test_a_multi_stream_query_lasts_from_its_first_issue_to_its_last_completion() -> None:
    # Two queries of 4: issued at 0-3 ms and 10-13 ms; the last completion of each at 8 and 30 ms.
    issued = np.array([0.0, 0.001, 0.002, 0.003, 0.010, 0.011, 0.012, 0.013])
    completed = np.array([0.005, 0.008, 0.006, 0.007, 0.020, 0.030, 0.015, 0.016])
    latencies = query_latencies(Samples(issued, completed, np.arange(8)), 4)
    assert latencies.tolist() == pytest.approx([0.008, 0.020])
    # A query some of whose samples were warm-up is left out.
    assert query_latencies(Samples(issued[2:], completed[2:], np.arange(2, 8)), 4).tolist() == pytest.approx([0.020])
    settings = RuleSettings(SCENARIOS["multi-stream"], 0.0, 2, samples_per_query=4)
    assert judge(settings, Samples(issued, completed, np.arange(8))).rules[-1].why == "660 more queries needed"


def test_min_duration_is_offline_s_last_completion_and_the_others_last_issue() -> None:
    run = samples([0.5] * 100, gap_s=0.001)   # issued over 0.099 s, the last completed at 0.599 s
    offline = judge(RuleSettings(SCENARIOS["offline"], 0.5, 100), run)
    server = judge(RuleSettings(SCENARIOS["server"], 0.5, 100, target_latency_s=1.0), run)
    assert offline.valid and offline.rules_text() == ("min duration satisfied: yes; min queries satisfied: yes; "
                                                      "early stopping satisfied: yes")
    assert dict(offline.result)["samples per second"] == pytest.approx(100 / 0.599)
    assert str(server.rules[1]) == ("min duration satisfied: no, the last query was issued 0.099 s after the start, "
                                    "under 0.5 s")


def test_min_queries_fails_only_a_run_that_ended_before_its_queries_were_issued() -> None:
    run = samples([0.01] * 500)
    settings = RuleSettings(SCENARIOS["server"], 0.0, 500, target_latency_s=0.1)
    assert judge(settings, run).rules[2].met
    short = judge(settings, run, issued=300).rules[2]
    assert (short.met, short.why) == (False, "300 of the 500 queries asked for were issued and completed")


def stamped(enqueued: np.ndarray, finished: np.ndarray) -> pa.Table:
    return pa.table({"enqueue": enqueued, "runner0_finish": finished})


def test_a_poisson_job_served_slower_than_offered_is_overloaded() -> None:
    # 1,000 requests at 254/s into a step that finishes one per 1/174 s: the queue grows all the way.
    index = np.arange(1000)
    table = stamped(index / 254, index / 174 + 0.01)
    assert overloaded({"mean_interval_ms": 1000 / 254}, table, 1) == "overloaded: offered 254/s, served 174/s."
    # Served as offered, however long each item took, and a queue that grew and drained again: no verdict.
    assert overloaded({"mean_interval_ms": 1000 / 254}, stamped(index / 254, index / 254 + 0.3), 1) is None
    burst = np.where((index > 400) & (index < 600), 0.5, 0.01)
    assert overloaded({"mean_interval_ms": 1000 / 254}, stamped(index / 254, index / 254 + burst), 1) is None


@pytest.mark.parametrize("args", [
    {"mean_interval_ms": 0}, {"concurrency": 4}, {"streams": 2, "stream_policy": "drop"},
    {"scenario": "multi-stream", "concurrency": 8}])
def test_loads_that_wait_for_the_pipeline_are_never_overloaded(args: dict) -> None:
    index = np.arange(1000)
    assert overloaded(args, stamped(index / 254, index / 174 + 0.01), 1) is None


@pytest.mark.parametrize("args", [{"streams": 2}, {"rate_schedule": "100@1s"}, {"arrivals": "trace.csv"}])
def test_every_open_loop_is_held_to_its_offered_load(args: dict) -> None:
    index = np.arange(1000)
    assert overloaded(args, stamped(index / 254, index / 174 + 0.01), 1) == "overloaded: offered 254/s, served 174/s."
