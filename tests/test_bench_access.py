"""bench/access_bench.py on tiny datasets: row ids and goals, exact byte counts, identical values, every row runs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import access_bench
from bench.common import Effort
from episodes import open_dataset
from episodes.testing.synthetic import make_dataset
from episodes.tools.streaming import random_targets, windows_track

EFFORT = Effort.of(quick=True)
TINY = dict(episodes=6, episodes_per_file=3, min_length=24, max_length=40, width=64, height=64)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("access")
    return {30: make_dataset(base / "gop30", dataclasses.replace(access_bench.GOP30, **TINY)),
            2: make_dataset(base / "gop2", dataclasses.replace(access_bench.GOP2, **TINY))}


@pytest.fixture
def tiny(roots: dict[int, Path], monkeypatch: pytest.MonkeyPatch) -> dict[int, Path]:
    monkeypatch.setattr(access_bench, "datasets", lambda cache_dir: roots)
    monkeypatch.setattr(access_bench, "TARGETS", 60)
    return roots


def test_random_frame_bytes_are_exact_counts(tiny: dict[int, Path], tmp_path: Path) -> None:
    rows = access_bench.access_rows("P2r", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    assert [row.id for row in rows] == ["P2r", "P2re", "P2r2", "P2r2e"]
    assert [str(row.goal) for row in rows] == ["<= 1.2", "None", "None", "None"]
    ds = open_dataset(str(tiny[30]))
    options = access_bench._options(60, cache_dir=str(tmp_path / "again"))
    again, _ = windows_track(ds, random_targets(ds, options), options)
    assert (rows[0].a.median, rows[0].b.median) == (again.bytes_fetched, again.bytes_useful)
    assert rows[0].b.median <= rows[0].a.median <= rows[1].a.median  # useful <= fetched <= whole episodes


def test_tabular_row_compares_identical_values(tiny: dict[int, Path], tmp_path: Path) -> None:
    (row,) = access_bench.access_rows("P11", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    assert row.id == "P11" and str(row.goal) == ">= 50" and row.reps == EFFORT.reps and row.ratio > 1


@pytest.mark.nginx
@pytest.mark.slow
def test_timed_rows_run_on_tiny_data(tiny: dict[int, Path], tmp_path: Path) -> None:
    remote = access_bench.access_rows("P3r", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    loader = access_bench.access_rows("P10", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    assert [row.id for row in remote] == ["P3r"] and remote[0].a.unit == "s" and remote[0].ratio > 0
    assert [row.id for row in loader] == ["P10", "P10b", "P10g30", "P10g30b"]
    assert loader[1].ratio < 1  # clips need fewer bytes than whole episodes
    with pytest.raises(ValueError, match="has no benchmark 'P99'"):
        access_bench.access_rows("P99", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
