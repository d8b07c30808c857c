"""Data columns: one protocol for both dataset kinds, and the usage-format cache, identical to Parquet."""
from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodes import EpisodeDataset, LeRobotDataset, VideoFilesDataset, open_episodes
from episodes._errors import DatasetFormatError
from episodes._layout import ROW_INDEX
from episodes._sidecar import local_cache_path
from episodes._source import guess_kind
from episodes._tabular import USAGE_DIR
from episodes.synthetic import SyntheticSpec

SPEC = SyntheticSpec(episodes=6, cameras=1, episodes_per_file=3, min_length=10, max_length=40, width=32,
                     height=32, gop=8, row_group_size=16, seed=5)
COLUMNS = ["observation.state", "action", "timestamp", "frame_index"]
# Tests take `root` (tests/conftest.py), a private copy, so each starts without usage-format files.


def parquet_rows(root: Path, ep: int, name: str) -> np.ndarray:
    """The episode's values of `name`, read without the code under test."""
    table = pa.concat_tables(pq.read_table(p) for p in sorted(root.glob("data/*/*.parquet")))
    rows = table.filter(pa.compute.equal(table.column("episode_index"), ep)).column(name).to_pylist()
    return np.asarray(rows)


def usage_dir(root: Path) -> Path:
    """The cache directory of the usage-format copies of `root`, a test's private copy: beside it, so also private."""
    return root.parent / "cache"


def mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file."""
    while array is not None:
        if isinstance(array, (np.memmap, mmap.mmap)):
            return True
        array = getattr(array, "base", None)
    return False


def test_one_function_opens_either_kind(root: Path) -> None:
    ds = open_episodes(str(root))
    videos = open_episodes(str(root / "videos" / "*" / "*" / "*.mp4"))
    assert isinstance(ds, LeRobotDataset) and isinstance(videos, VideoFilesDataset)
    for opened in (ds, videos):
        checked: EpisodeDataset = opened
        assert checked.num_episodes and checked.fps == 30.0 and checked.video_keys
    assert videos.num_episodes == 2 and [videos.episode_length(e) for e in range(2)] == [
        sum(ds.episode_length(e) for e in range(f * 3, f * 3 + 3)) for f in range(2)]
    assert guess_kind("x/*.mp4") == guess_kind("clip.MP4") == "videos" and guess_kind("s3://b/ds") == "dataset"
    assert isinstance(open_episodes(str(root / "videos" / "*" / "*" / "*.mp4"), "videos"), VideoFilesDataset)
    with pytest.raises(ValueError, match="kind must be one of dataset, videos, not 'table'"):
        open_episodes(str(root), "table")  # type: ignore[arg-type]
    with pytest.raises(DatasetFormatError, match=r"file-000\.mp4: episode 0: data columns 'action' were asked for, "
                                                 "but plain video files have no data table"):
        videos.episode_columns(0, ["action"])


@pytest.mark.parametrize("usage", [False, True])
def test_episode_columns_equal_the_parquet_rows(root: Path, usage: bool) -> None:
    ds = open_episodes(str(root), usage_cache_dir=usage_dir(root) if usage else None)
    for ep in range(ds.num_episodes):
        got = ds.episode_columns(ep, COLUMNS)
        for name in COLUMNS:
            np.testing.assert_array_equal(got[name], parquet_rows(root, ep, name).astype(got[name].dtype), strict=True)
        assert got["observation.state"].shape == (ds.episode_length(ep), 6)
        assert (got["observation.state"].dtype, got["timestamp"].dtype, got["frame_index"].dtype) == (
            np.float32, np.float32, np.int64)
    assert local_cache_path(ds.storage, USAGE_DIR, usage_dir(root)).is_dir() == usage
    assert not (root / "meta" / USAGE_DIR).exists()  # derived files never go inside the dataset


def test_usage_copies_are_memmaps_reused_by_a_new_reader(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = open_episodes(str(root), usage_cache_dir=usage_dir(root))
    state = first.episode_columns(4, ["observation.state"])["observation.state"]
    assert mapped(state) and not state.flags.writeable
    folder = local_cache_path(first.storage, USAGE_DIR, usage_dir(root)) / "data%2Fchunk-000%2Ffile-001.parquet"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["columns"] == sorted(["observation.state", ROW_INDEX])

    second = open_episodes(str(root), usage_cache_dir=usage_dir(root))
    monkeypatch.setattr(second.storage, "open_parquet", lambda rel: pytest.fail(f"Parquet {rel} was read again"))
    np.testing.assert_array_equal(second.episode_columns(4, ["observation.state"])["observation.state"], state)
    monkeypatch.undo()
    second.episode_columns(5, ["action"])  # a column not copied yet is added beside the others
    assert json.loads((folder / "manifest.json").read_text())["columns"] == sorted(
        ["action", "observation.state", ROW_INDEX])


def test_a_changed_source_is_read_again(root: Path) -> None:
    before = open_episodes(str(root), usage_cache_dir=usage_dir(root)).episode_columns(0, ["action"])["action"].copy()
    path = root / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    doubled = pa.FixedSizeListArray.from_arrays(
        pa.compute.multiply(table.column("action").combine_chunks().flatten(), pa.scalar(2, pa.float32())), 6)
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", doubled), path,
                   row_group_size=SPEC.row_group_size)
    os.utime(path, ns=(1, 10**18))  # a new mtime even on a coarse clock
    again = open_episodes(str(root), usage_cache_dir=usage_dir(root)).episode_columns(0, ["action"])["action"]
    np.testing.assert_array_equal(again, 2 * before, strict=True)


def test_bad_columns_name_file_and_episode(root: Path) -> None:
    for usage in (False, True):
        ds = open_episodes(str(root), usage_cache_dir=usage_dir(root) if usage else None)
        with pytest.raises(DatasetFormatError, match=r"data/chunk-000/file-000\.parquet: .*column 'nope' is missing"):
            ds.episode_columns(1, ["nope"])


@pytest.mark.parametrize("usage", [False, True])
def test_rows_missing_from_the_index_column_are_an_error(root: Path, usage: bool) -> None:
    path = root / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    shifted = pa.compute.add(table.column(ROW_INDEX), 1000)
    pq.write_table(table.set_column(table.schema.get_field_index(ROW_INDEX), ROW_INDEX, shifted), path)
    ds = open_episodes(str(root), usage_cache_dir=usage_dir(root) if usage else None)
    last = ds.episode_length(0) - 1
    with pytest.raises(DatasetFormatError, match=rf"file-000\.parquet: episode 0: column 'index' does not hold rows "
                                                 rf"0\.\.{last}"):
        ds.episode_columns(0, ["action"])
