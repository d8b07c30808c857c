"""bench/access_bench.py and bench/floor_bench.py on tiny datasets: ids, goals, exact counts, identical values, rows run."""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest
import torch

from bench import access_bench, floor_bench
from bench.common import Effort
from bench.floor_bench import InMemoryFloor
from episodes import EpisodeByteCache, FrameRequest, open_dataset
from episodes.synthetic import make_dataset
from episodes.tools.streaming import random_targets, windows_track
from rnb.core.timecard import TimeCard

EFFORT = Effort.of(quick=True)
THREADS = torch.get_num_threads()
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


# ---- the decoding floor (P3rd, P10d), the network and 480x640 rows ----------------------------------


def test_the_in_memory_floor_decodes_the_frames_the_cache_reads(tiny: dict[int, Path]) -> None:
    ds = open_dataset(str(tiny[30]))
    key = ds.video_keys[0]
    floor = InMemoryFloor(ds, key)
    with EpisodeByteCache(ds) as cache:
        for ep in (0, 2, 3, 5):  # both files, an episode starting mid-GOP
            numbers = [0, 1, ds.episode_length(ep) // 2, ds.episode_length(ep) - 1]
            read = floor.read(ep, numbers)
            assert read.path == ds.episode(ep).videos[key].path
            assert torch.equal(floor.frames(read), cache.read_frames([FrameRequest(ep, key, frame_numbers=numbers)])[0].frames)


def test_floor_items_are_the_items_the_loader_makes(tiny: dict[int, Path]) -> None:
    root = str(tiny[30])
    ds = open_dataset(root)
    floor = InMemoryFloor(ds, ds.video_keys[0])
    items = floor_bench.floor_items(root, floor, 4, 3)
    requests = access_bench.item_requests(root, 4, 4)
    loader = access_bench.LoaderSetup("episode", prefetch=0, workers=1, decode_threads=1).loader(4)
    for i, item in enumerate(items, start=1):
        (clips,), out, _ = loader((), {"request": requests[i]}, TimeCard(i))
        assert item.frames.shape == (10, 8) and out["episode"] == requests[i].episode
        assert torch.equal(floor_bench.floor_clips(floor, item), clips)


def test_p10d_compares_the_loader_with_its_floor(tiny: dict[int, Path], tmp_path: Path) -> None:
    (row,) = floor_bench.floor_rows("P10d", EFFORT, lambda: tiny, lambda: tiny, tmp_path)
    assert (row.id, str(row.goal), row.reps) == ("P10d", ">= 0.85", EFFORT.reps)
    assert (row.a.label, row.a.unit, row.b.label, row.b.unit) == ("loader", "items/s", "in memory", "items/s")
    # The loader over its floor, repetition by repetition: the median, least and most of a[i] / b[i].
    ratios = [a / b for a, b in zip(row.a.values, row.b.values, strict=True)]
    assert len(ratios) == EFFORT.reps and all(value > 0 for value in (*row.a.values, *row.b.values))
    assert (row.ratio, row.low, row.high) == (statistics.median(ratios), min(ratios), max(ratios))
    assert (row.a.median, row.b.median) == (statistics.median(row.a.values), statistics.median(row.b.values))
    assert "64x64" in row.note and "waiting for its fetch" in row.note
    assert torch.get_num_threads() == THREADS  # the row's one thread is given back
    with pytest.raises(ValueError, match="has no benchmark 'P10'"):
        floor_bench.floor_rows("P10", EFFORT, lambda: tiny, lambda: tiny, tmp_path)


@pytest.mark.slow
def test_480x640_rows_run_on_the_datasets_they_are_given(tiny: dict[int, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access_bench, "vga_datasets", lambda cache_dir, effort: tiny)
    (decode,) = access_bench.access_rows("P4r", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    loader = access_bench.access_rows("P10r", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    assert (decode.id, str(decode.goal), decode.a.unit) == ("P4r", ">= 0.9", "frames/CPU-s")
    assert "64x64" in decode.what
    assert [(row.id, row.goal) for row in loader] == [("P10r", None), ("P10rb", None)]
    assert loader[1].ratio < 1 and loader[1].reps == EFFORT.reps + 1  # the warm-up pair's bytes count too


@pytest.mark.parametrize(("link_s", "decode_s", "bound_s"), [
    ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 0.5 + 1.0 + 6.0),      # decode-bound: the first bytes, then every decode
    ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 0.5 + 6.0 + 1.0),      # link-bound: every byte, then the last decode
    ([3.0, 1.0], [1.0, 3.0], 0.5 + 3.0 + 1.0 + 3.0),          # the second request's bytes wait on the first's
    ([1.0, 3.0], [3.0, 1.0], 0.5 + 1.0 + 3.0 + 1.0),          # the same work in the other order: the decode hides the link
])
def test_the_in_order_bound_is_a_two_stage_flow_shop_worked_by_hand(link_s: list[float], decode_s: list[float],
                                                                    bound_s: float) -> None:
    assert floor_bench.in_order_bound_s(0.5, link_s, decode_s) == pytest.approx(bound_s)


@pytest.mark.nginx
@pytest.mark.slow
def test_network_rows_run_on_tiny_data(tiny: dict[int, Path], tmp_path: Path) -> None:
    (windows,) = floor_bench.floor_rows("P3rd", EFFORT, lambda: tiny, lambda: tiny, tmp_path)
    assert (windows.id, str(windows.goal), windows.a.unit) == ("P3rd", "<= 1.1", "s") and windows.ratio > 0
    assert "decoding" in windows.note
    network = access_bench.access_rows("P10n", EFFORT, tmp_path, tmp_path, lambda: tiny[30])
    assert [(row.id, str(row.goal)) for row in network] == [("P10n", ">= 1.85"), ("P10nb", "None")]
    assert "with the clips' wait at 0 the ratio would be" in network[0].note
