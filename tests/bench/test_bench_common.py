"""bench/common.py: pairing order, medians, spread, goals, the table and the JSON file, on fake measurements."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from bench.common import Goal, Report, Row, Side, compare, measure_pair, paired, table_text, write_json


def recorder(name: str, values: list[float], log: list[str]) -> Callable[[], float]:
    feed: Iterator[float] = iter(values)

    def measure() -> float:
        log.append(name)
        return next(feed)
    return measure


def test_paired_alternates_the_order_and_drops_the_warmup_pair() -> None:
    log: list[str] = []
    a, b = paired(recorder("a", [1, 2, 3, 4, 5, 6], log), recorder("b", [10, 20, 30, 40, 50, 60], log), reps=5)
    assert log == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert a == (2, 3, 4, 5, 6)
    assert b == (20, 30, 40, 50, 60)


def test_paired_without_warmup_keeps_every_pair() -> None:
    log: list[str] = []
    a, b = paired(recorder("a", [5, 4, 3, 2, 1], log), recorder("b", [1, 1, 1, 1, 1], log), reps=5, warmup=0)
    assert log == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert a == (5, 4, 3, 2, 1)


def test_fewer_than_five_repetitions_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^a figure needs at least 5 paired repetitions, not 4$"):
        paired(lambda: 1.0, lambda: 1.0, reps=4)


def test_the_ratio_is_the_median_of_paired_ratios_not_the_ratio_of_medians() -> None:
    # Per-pair ratios 8/2, 3/3, 9/3, 1/1, 12/4 = 4, 1, 3, 1, 3 -> median 3; medians alone would give 8/3.
    row = compare("P9", "demo", Goal(">=", 2.5), Side.of("fast", "items/s", (8, 3, 9, 1, 12)),
                  Side.of("slow", "items/s", (2, 3, 3, 1, 4)))
    assert row.ratio == 3
    assert (row.low, row.high, row.reps) == (1, 4, 5)
    assert row.a is not None and row.a.median == 8
    assert row.met is True
    assert Goal(">=", 3.5).met(row.ratio) is False
    assert Goal("<=", 3).met(row.ratio) is True
    assert Goal("==", 0).met(0) is True


def test_measure_pair_builds_the_row_from_measurements() -> None:
    log: list[str] = []
    row = measure_pair("P1", "x", Goal(">=", 0.95), ("harness", "items/s", recorder("a", [9, 1, 2, 3, 4, 5], log)),
                       ("loop", "items/s", recorder("b", [9, 2, 2, 2, 2, 2], log)), reps=5)
    assert (row.ratio, row.low, row.high) == (1.5, 0.5, 2.5)
    assert row.b == Side("loop", "items/s", 2, (2, 2, 2, 2, 2))


def test_a_zero_denominator_names_the_row_and_repetition() -> None:
    with pytest.raises(ValueError, match=r"^P5: side B \(queue\) measured 0 items/s in repetition 3, "
                                         r"so the ratio A/B is undefined$"):
        compare("P5", "ipc", Goal(">=", 5), Side.of("slot", "items/s", (1, 1, 1, 1, 1)),
                Side.of("queue", "items/s", (1, 1, 0, 1, 1)))


def test_an_unknown_goal_operator_is_refused() -> None:
    assert Goal("within", 0.05).met(1.049) and Goal("within", 0.05).met(0.951) and not Goal("within", 0.05).met(1.06)
    assert str(Goal("within", 0.05)) == "1 ± 0.05"
    with pytest.raises(ValueError, match=r"^a goal's operator must be '>=', '<=', '==' or 'within', not '>'$"):
        Goal(">", 1)


def test_table_and_json_of_measured_summarised_and_skipped_rows(tmp_path) -> None:
    measured = compare("P5", "ipc", Goal(">=", 5), Side.of("slot", "items/s", (600, 700, 500, 650, 640)),
                       Side.of("pickle", "items/s", (100, 100, 100, 100, 100)))
    skipped = Row("P8", "gpu", Goal(">=", 0.95), note="skipped: no CUDA device")
    info = Row("P2w", "widened", None, ratio=1.5, low=1.25, high=2.0, reps=40)
    assert table_text([measured, skipped, info]).splitlines() == [
        "id   what     A                  B                    ratio median [min, max]  goal     met",
        "---  -------  -----------------  -------------------  -----------------------  -------  ---",
        "P5   ipc      slot: 640 items/s  pickle: 100 items/s  6.40 [5.00, 7.00]        >= 5     yes",
        "P8   gpu      -                  -                    -                        >= 0.95  -",
        "P2w  widened  -                  -                    1.50 [1.25, 2.00]        -        -",
        "P8: skipped: no CUDA device",
    ]
    path = tmp_path / "bench.json"
    write_json(path, Report((measured, skipped, info), quick=True, context={"host": "h"}))
    document = json.loads(path.read_text())
    assert document["quick"] is True and document["host"] == "h"
    assert document["entries"] == [
        {"id": "P5", "what": "ipc", "ratio": 6.4, "goal": ">= 5", "met": True, "min": 5.0, "max": 7.0, "reps": 5,
         "a": {"label": "slot", "unit": "items/s", "median": 640, "values": [600, 700, 500, 650, 640]},
         "b": {"label": "pickle", "unit": "items/s", "median": 100, "values": [100, 100, 100, 100, 100]},
         "note": ""},
        {"id": "P8", "what": "gpu", "ratio": None, "goal": ">= 0.95", "met": None, "min": None, "max": None,
         "reps": 0, "a": None, "b": None, "note": "skipped: no CUDA device"},
        {"id": "P2w", "what": "widened", "ratio": 1.5, "goal": None, "met": None, "min": 1.25, "max": 2.0,
         "reps": 40, "a": None, "b": None, "note": ""},
    ]
