"""The reliability bench's own instruments: its broken inputs, its mutations, its tally and table.

The job trials themselves (seconds each) run only in `bench/faults.py`; the
behaviours they count are tested in tests/test_reliability.py and
tests/test_harness_faults.py.
"""
from __future__ import annotations

from pathlib import Path

from bench.fault_inputs import check_config, hand_made, mutants
from bench.faults import FaultRow, table
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
    assert table([row]).splitlines()[2] == "| x | a fault | 2 | 1 | 1.50 | 2 | 1 |"
    row.add(True, None)
    assert table([row], header=False) == "| x | a fault | 3 | 2 | 1.50 | 2 | n/a |"
