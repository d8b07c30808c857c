"""What every benchmark row shares: paired A/B repetitions, the table, the JSON file.

This machine is shared and noisy, so no figure is an absolute time.  A figure
is the median, over at least MIN_REPS repetitions, of the ratio A/B where A
and B were measured back to back, in alternating order, so that drift and the
neighbours' load hit both sides alike.  The spread of the per-repetition
ratios (min, max) travels with the median so a reader can judge the noise.
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_REPS = 5


@dataclass(frozen=True)
class Effort:
    """How hard a run measures: `--quick` keeps MIN_REPS repetitions and shortens each one."""

    quick: bool
    reps: int

    @staticmethod
    def of(quick: bool) -> Effort:
        return Effort(quick, MIN_REPS if quick else 7)

    def pick(self, quick: int, full: int) -> int:
        return quick if self.quick else full


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what was measured, its unit, its median and, when known, each repetition."""

    label: str
    unit: str
    median: float
    values: tuple[float, ...] = ()

    @staticmethod
    def of(label: str, unit: str, values: Sequence[float]) -> Side:
        return Side(label, unit, statistics.median(values), tuple(values))

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "unit": self.unit, "median": self.median, "values": list(self.values)}


@dataclass(frozen=True)
class Goal:
    """What the ratio must satisfy, e.g. Goal(">=", 0.95), or Goal("within", 0.05): 0.95 to 1.05."""

    op: str
    target: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<=", "==", "within"):
            raise ValueError(f"a goal's operator must be '>=', '<=', '==' or 'within', not {self.op!r}")

    def met(self, ratio: float) -> bool:
        if self.op == ">=":
            return ratio >= self.target
        if self.op == "<=":
            return ratio <= self.target
        if self.op == "within":   # a ratio of two sides that must agree: 1 give or take the target
            return abs(ratio - 1.0) <= self.target
        return ratio == self.target

    def __str__(self) -> str:
        return f"1 ± {self.target:g}" if self.op == "within" else f"{self.op} {self.target:g}"


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure (usually a ratio A/B) with its spread, against its goal.

    `ratio` is None when the benchmark was skipped or failed, and `note` says
    why.  `reps` counts what the median was taken over (repetitions, or
    episodes for a per-episode figure); `goal` None marks a figure reported
    for information only.
    """

    id: str
    what: str
    goal: Goal | None
    a: Side | None = None
    b: Side | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    reps: int = 0
    note: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.ratio is None or self.goal is None else self.goal.met(self.ratio)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "what": self.what, "ratio": self.ratio, "goal": None if self.goal is None else str(self.goal),
            "met": self.met, "min": self.low, "max": self.high, "reps": self.reps,
            "a": None if self.a is None else self.a.to_json(),
            "b": None if self.b is None else self.b.to_json(),
            "note": self.note,
        }


def paired(measure_a: Callable[[], float], measure_b: Callable[[], float], reps: int,
           warmup: int = 1) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Run A and B `reps` times each, alternating AB, BA, AB, ...; `warmup` pairs are discarded.

    Alternating the order cancels the advantage of going first or second
    (warm caches, a neighbour's burst) that a fixed order would bake in.
    """
    if reps < MIN_REPS:
        raise ValueError(f"a figure needs at least {MIN_REPS} paired repetitions, not {reps}")
    a_values: list[float] = []
    b_values: list[float] = []
    for rep in range(warmup + reps):
        if rep % 2 == 0:
            a, b = measure_a(), measure_b()
        else:
            b, a = measure_b(), measure_a()
        if rep >= warmup:
            a_values.append(a)
            b_values.append(b)
    return tuple(a_values), tuple(b_values)


def compare(id: str, what: str, goal: Goal | None, a: Side, b: Side, note: str = "") -> Row:
    """The row whose per-repetition ratios are a[i] / b[i]."""
    if len(a.values) != len(b.values) or not a.values:
        raise ValueError(f"{id}: sides A and B need the same, non-zero number of values, "
                         f"found {len(a.values)} and {len(b.values)}")
    if 0 in b.values:
        raise ValueError(f"{id}: side B ({b.label}) measured 0 {b.unit} in repetition {b.values.index(0) + 1}, "
                         "so the ratio A/B is undefined")
    ratios = [x / y for x, y in zip(a.values, b.values)]
    return Row(id, what, goal, a, b, statistics.median(ratios), min(ratios), max(ratios), len(ratios), note)


def measure_pair(id: str, what: str, goal: Goal | None, a: tuple[str, str, Callable[[], float]],
                 b: tuple[str, str, Callable[[], float]], reps: int, warmup: int = 1, note: str = "") -> Row:
    """Measure (label, unit, measure) sides A and B by `paired` and make their row."""
    a_values, b_values = paired(a[2], b[2], reps, warmup)
    return compare(id, what, goal, Side.of(a[0], a[1], a_values), Side.of(b[0], b[1], b_values), note)


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _side_cell(side: Side | None) -> str:
    return "-" if side is None else f"{side.label}: {_number(side.median)} {side.unit}"


def _ratio_cell(row: Row) -> str:
    if row.ratio is None:
        return "-"
    if row.low is None or row.high is None:
        return _number(row.ratio)
    return f"{_number(row.ratio)} [{_number(row.low)}, {_number(row.high)}]"


def _met_cell(row: Row) -> str:
    return {True: "yes", False: "NO", None: "-"}[row.met]


HEADER = ("id", "what", "A", "B", "ratio median [min, max]", "goal", "met")


def table_text(rows: Sequence[Row]) -> str:
    """The aligned plain-text table; notes follow it, one line per row that has one."""
    lines = [HEADER] + [(r.id, r.what, _side_cell(r.a), _side_cell(r.b), _ratio_cell(r),
                                          "-" if r.goal is None else str(r.goal), _met_cell(r))
                        for r in rows]
    widths = [max(len(line[c]) for line in lines) for c in range(len(HEADER))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    text += [f"{row.id}: {row.note}" for row in rows if row.note]
    return "\n".join(text)


@dataclass(frozen=True)
class Report:
    """Everything one `bench/run.py` invocation writes to its JSON file."""

    rows: tuple[Row, ...]
    quick: bool
    context: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"quick": self.quick, **self.context, "entries": [row.to_json() for row in self.rows]}


def write_json(path: str | Path, report: Report) -> None:
    # allow_nan=False: a file other tools cannot parse must fail here, not in their hands.
    Path(path).write_text(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
