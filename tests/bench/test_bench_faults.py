"""The reliability bench's own instruments: its broken inputs, its mutations, its tally and table.

The job trials themselves (seconds each) run only in `bench/faults.py`; the
behaviours they count are tested in tests/engines/test_reliability.py and
tests/engines/test_harness_faults.py.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import ring_stress
from bench.fault_inputs import check_config, hand_made, mutants
from bench.fault_jobs import JobRun
from bench.fault_stalls import Ending, Verdict, hung_at, judge_stall
from bench.fault_trials import FaultRow, table
from bench.ring_stress import GET_OVERRUN_BOUND_S, StressResult
from bench.ring_stress import table as ring_table
from rnb import cli

CONFIGS = sorted(Path("config").glob("*.json"))


def test_every_hand_made_input_is_refused_by_check_in_one_sentence_of_its_own(tmp_path) -> None:
    said = {}
    for what, argv in hand_made(tmp_path):
        passed, _, sentence = check_config(argv)
        assert passed and sentence, f"{what}: {sentence!r}"
        said[what] = sentence
    assert len(said) == 19 and len(set(said.values())) == 19
    assert "expected a regular JSON file, found a named pipe (FIFO)" in said["a FIFO"]


def test_check_config_counts_an_escaping_exception_as_a_failure(monkeypatch) -> None:
    def overflow(argv: list[str]) -> int:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(cli, "main", overflow)
    assert check_config(["-c", "x.json"])[::2] == (False, "RecursionError: maximum recursion depth exceeded")


def test_mutants_are_the_same_for_one_seed_and_change_with_it() -> None:
    first = mutants(CONFIGS, 30, seed=0)
    assert first == mutants(CONFIGS, 30, seed=0)
    assert first != mutants(CONFIGS, 30, seed=1)
    assert len(first) == 30 and all(what.split(":")[0] in {c.name for c in CONFIGS} for what, _ in first)


def test_a_row_tallies_trials_and_says_n_a_once_a_trial_could_not_count_shared_memory() -> None:
    row = FaultRow("x", "a fault")
    row.add(True, 1.5, orphans=0, leftovers=0)
    row.add(False, 0.5, "trial 1: exit 3", orphans=2, leftovers=1)
    assert (row.trials, row.passes, row.worst_exit_s, row.orphans, row.leftovers) == (2, 1, 1.5, 2, 1)
    assert row.failures == ["trial 1: exit 3"]
    assert table([row]).splitlines()[2] == "| x | a fault | 2 | 1 | - | 1.50 | - | 2 | 1 |"
    row.add(True, None)
    assert table([row], header=False) == "| x | a fault | 3 | 2 | - | 1.50 | - | 2 | n/a |"
    row.add(True, 0.5, lost=0, end_s=0.25)
    row.add(True, 0.5, lost=2)
    assert table([row], header=False) == "| x | a fault | 5 | 4 | 0.25 | 1.50 | 2 | 2 | n/a |"


def test_a_stall_trial_passes_only_with_its_ending_its_items_all_logged_and_inside_its_bound() -> None:
    def run(**meta: object) -> JobRun:
        return JobRun(1, "", "fault: x hangs (lock) at 100.000\n", {"termination_reason": "stalled", **meta}, 108.0,
                      108.5, 0, 0)

    ending = Ending(1, "stalled", rows=5, bound_s=5.0)
    assert hung_at(run().stderr) == 100.0
    assert judge_stall(run(counted_items=5, finished_items=5, end_time=104.0), 100.0, ending) == Verdict(
        True, 8.0, 4.0, 0, "")
    lost = judge_stall(run(counted_items=5, finished_items=3, end_time=104.0), 100.0, ending)
    assert (lost.passed, lost.lost, lost.note) == (False, 2, "2 finished items missing from the log, 3 items in the "
                                                             "log, not 5")
    assert judge_stall(run(counted_items=5, finished_items=5, end_time=105.5), 100.0, ending).note == (
        "ended 5.5 s after the fault, past 5 s")


def test_the_ring_row_passes_only_when_every_loss_is_a_killed_consumers_one_message_and_no_get_ran_late() -> None:
    kept = StressResult(60.0, kills=100, holder_kills=80, consumer_kills=20, stops=5, acknowledged=10**6, lost=3,
                        stranded=0, duplicated=0, worst_overrun_s=0.02, recoveries=30)
    assert kept.passed and kept.kills_per_minute == 100
    for broken in ({"lost": 21}, {"stranded": 1}, {"duplicated": 1}, {"worst_overrun_s": GET_OVERRUN_BOUND_S + 0.01}):
        assert not dataclasses.replace(kept, **broken).passed, broken
    assert ring_table([kept], header=False) == (
        "| ring-stress | 4 producers, 2 consumers on a 4 KiB ring, lock holders SIGKILLed | 60 | 100 | 80 | 20 | 5 | "
        "1,000,000 | 3 | 0 | 0 | 0.020 | 30 | yes |")


@pytest.mark.slow
def test_a_short_ring_stress_run_kills_lock_holders_and_loses_only_what_killed_consumers_held() -> None:
    result = ring_stress.run(4.0, seed=1)
    assert result.kills > 0 and result.acknowledged > 0
    assert (result.stranded, result.duplicated) == (0, 0) and result.lost <= result.consumer_kills
