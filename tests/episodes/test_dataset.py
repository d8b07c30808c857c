"""open_dataset: records, episode rows and every metadata error, on generated datasets."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodes._dataset import EpisodeRecord, VideoSegment, open_dataset
from episodes._errors import DatasetFormatError, FetchError
from episodes._tabular import column_array
from episodes.synthetic import SyntheticSpec
from episodes.testing.server import serve_directory

SPEC = SyntheticSpec(episodes=7, cameras=2, episodes_per_file=3, files_per_chunk=2, min_length=10,
                     max_length=40, width=64, height=64, gop=8, bframes=2, row_group_size=16, seed=3)
KEYS = ("observation.images.cam0", "observation.images.cam1")


def frame_rows(root: Path) -> pa.Table:
    """All data rows, read independently of the code under test."""
    return pa.concat_tables(pq.read_table(p) for p in sorted(root.glob("data/*/*.parquet")))


def test_counts_fps_keys_and_lengths(source: Path) -> None:
    ds = open_dataset(str(source))
    rows = frame_rows(source)
    expected = np.bincount(rows.column("episode_index").to_numpy())
    assert ds.num_episodes == SPEC.episodes == len(expected)
    assert ds.fps == 30.0
    assert ds.video_keys == KEYS
    assert [ds.episode_length(i) for i in range(ds.num_episodes)] == expected.tolist()
    assert ds.root == str(source)


def test_records_point_at_files_that_exist(source: Path) -> None:
    ds = open_dataset(str(source))
    rec = ds.episode(6)  # the 7th episode sits in the third file, i.e. chunk 1, file 0
    assert isinstance(rec, EpisodeRecord)
    assert rec.data_path == "data/chunk-001/file-000.parquet"
    assert rec.videos["observation.images.cam1"].path == "videos/observation.images.cam1/chunk-001/file-000.mp4"
    assert rec.videos["observation.images.cam1"].from_timestamp == 0.0
    for i in range(ds.num_episodes):
        r = ds.episode(i)
        assert (source / r.data_path).is_file()
        assert all((source / v.path).is_file() for v in r.videos.values())
        assert r.dataset_to_index - r.dataset_from_index == r.length


def test_timestamps_match_lengths_and_restart_per_file(source: Path) -> None:
    ds = open_dataset(str(source))
    previous: dict[str, VideoSegment] = {}
    restarts = 0
    for i in range(ds.num_episodes):
        rec = ds.episode(i)
        for key, seg in rec.videos.items():
            assert abs((seg.to_timestamp - seg.from_timestamp) * ds.fps - rec.length) < 0.5
            before = previous.get(key)
            if before is None or before.path != seg.path:
                assert seg.from_timestamp == 0.0
                restarts += 1
            else:
                assert seg.from_timestamp == before.to_timestamp
            previous[key] = seg
    assert restarts == 3 * len(KEYS)


def test_episode_table_holds_exactly_the_episode_rows(source: Path) -> None:
    ds = open_dataset(str(source))
    for i in range(ds.num_episodes):
        rec = ds.episode(i)
        table = ds.episode_table(i)
        assert table.num_rows == rec.length
        assert table.column("episode_index").to_pylist() == [i] * rec.length
        assert table.column("frame_index").to_pylist() == list(range(rec.length))
        assert table.column("index").to_pylist() == list(range(rec.dataset_from_index, rec.dataset_to_index))
        expected_ts = (np.arange(rec.length) / ds.fps).astype(np.float32)
        assert np.array_equal(table.column("timestamp").to_numpy(), expected_ts)


def test_episode_table_reads_only_needed_row_groups_and_columns(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = open_dataset(str(source))
    read: list[tuple[list[int], list[str]]] = []
    real = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, columns=None, **kw):
        read.append((list(row_groups), list(columns)))
        return real(self, row_groups, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    rec = ds.episode(4)
    table = ds.episode_table(4, columns=["action"])
    assert table.column_names == ["action"]
    total_groups = pq.ParquetFile(source / rec.data_path).metadata.num_row_groups
    (groups, columns), = read
    assert set(columns) == {"action", "index"}
    assert 0 < len(groups) < total_groups
    full = pq.read_table(source / rec.data_path)
    mask = np.isin(full.column("index").to_numpy(), np.arange(rec.dataset_from_index, rec.dataset_to_index))
    assert table.column("action").to_pylist() == full.filter(pa.array(mask)).column("action").to_pylist()


def test_column_array_is_a_zero_copy_view(source: Path) -> None:
    ds = open_dataset(str(source))
    table = ds.episode_table(0, columns=["observation.state", "action"])
    state = column_array(table.column("observation.state"), "observation.state", "here")
    assert state.shape == (ds.episode_length(0), 6) and state.dtype == np.float32
    chunk = table.column("observation.state").chunk(0)
    assert table.column("observation.state").num_chunks == 1
    assert state.ctypes.data == chunk.flatten().buffers()[1].address
    assert not state.flags.owndata
    assert state.tolist() == [list(np.float32(v) for v in row) for row in chunk.to_pylist()]
    stamps = column_array(ds.episode_table(0, columns=["timestamp"]).column("timestamp"), "timestamp", "here")
    assert stamps.dtype == np.float32 and stamps.shape == (ds.episode_length(0),)
    with pytest.raises(DatasetFormatError, match="^here: column 'task' is string, not numeric or a fixed-size list"):
        column_array(pa.chunked_array([["a", "b"]]), "task", "here")
    with pytest.raises(DatasetFormatError, match="^here: column 'x' has null values"):
        column_array(pa.chunked_array([[1.0, None]]), "x", "here")


@pytest.mark.parametrize("ep", [7, -1, 100, True, 1.0])
def test_episode_index_out_of_range(source: Path, ep: object) -> None:
    ds = open_dataset(str(source))
    with pytest.raises(DatasetFormatError, match=rf"episode index {ep!r} is out of range \(the dataset has 7 episodes\)"):
        ds.episode(ep)
    with pytest.raises(DatasetFormatError, match="out of range"):
        ds.episode_length(ep)


def edit_info(root: Path, **changes: object) -> None:
    info_file = root / "meta" / "info.json"
    info = json.loads(info_file.read_text())
    for key, value in changes.items():
        if value is None:
            del info[key]
        else:
            info[key] = value
    info_file.write_text(json.dumps(info))


def test_missing_info_json(root: Path) -> None:
    (root / "meta" / "info.json").unlink()
    with pytest.raises(FetchError, match=r"meta/info\.json: file not found"):
        open_dataset(str(root))


def test_malformed_info_json(root: Path) -> None:
    (root / "meta" / "info.json").write_text("{not json")
    with pytest.raises(DatasetFormatError, match=r"meta/info\.json: not valid JSON"):
        open_dataset(str(root))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"codebase_version": "v2.1"}, "field 'codebase_version' is 'v2.1'; only 'v3.0' is supported"),
        ({"codebase_version": None}, "field 'codebase_version' is missing"),
        ({"fps": None}, "field 'fps' is missing"),
        ({"fps": "30"}, r"field 'fps' has the wrong type \(str\)"),
        ({"fps": 0}, "field 'fps' must be positive, got 0"),
        ({"features": None}, "field 'features' is missing"),
        ({"features": {"cam": {"shape": [1]}}}, r"field 'features\.cam\.dtype' is missing or not a string"),
        ({"data_path": None}, "field 'data_path' is missing"),
        ({"video_path": 3}, r"field 'video_path' has the wrong type \(int\)"),
    ],
)
def test_bad_info_fields(root: Path, changes: dict, message: str) -> None:
    edit_info(root, **changes)
    with pytest.raises(DatasetFormatError, match=r"meta/info\.json: " + message):
        open_dataset(str(root))


def test_template_outside_root_names_the_field(root: Path) -> None:
    edit_info(root, video_path="../../{video_key}/file-{file_index:03d}.mp4")
    # Refused when the dataset opens, not at the first episode that uses the path.
    with pytest.raises(DatasetFormatError, match=r"info\.json: field 'video_path' gives "
                       r"'\.\./\.\./observation\.images\.cam0/file-000\.mp4' for episode 0, which is outside the dataset root"):
        open_dataset(str(root))


def test_template_with_unknown_placeholder(root: Path) -> None:
    edit_info(root, data_path="data/{shard}.parquet")
    with pytest.raises(DatasetFormatError,
                       match=r"info\.json: field 'data_path' is not a valid path template \(KeyError\('shard'\)\)"):
        open_dataset(str(root))


def rewrite_episodes(root: Path, change) -> Path:
    path = root / "meta" / "episodes" / "chunk-000" / "file-001.parquet"
    pq.write_table(change(pq.read_table(path)), path)
    return path


def test_episodes_parquet_missing_column(root: Path) -> None:
    rewrite_episodes(root, lambda t: t.drop_columns(["videos/observation.images.cam1/to_timestamp"]))
    with pytest.raises(DatasetFormatError,
                       match=r"chunk-000/file-001\.parquet: field 'videos/observation\.images\.cam1/to_timestamp' is missing"):
        open_dataset(str(root))


def test_episodes_parquet_length_mismatch(root: Path) -> None:
    rewrite_episodes(root, lambda t: t.set_column(1, "length", pa.array([1, 2, 3], pa.int64())))
    with pytest.raises(DatasetFormatError, match="episode 3: field 'length' disagrees"):
        open_dataset(str(root))


def test_episodes_parquet_gap_in_indices(root: Path) -> None:
    (root / "meta" / "episodes" / "chunk-000" / "file-001.parquet").unlink()
    with pytest.raises(DatasetFormatError, match=r"field 'episode_index' is not 0\.\.3 without gaps"):
        open_dataset(str(root))


def test_episodes_parquet_corrupt(root: Path) -> None:
    (root / "meta" / "episodes" / "chunk-001" / "file-000.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(DatasetFormatError, match=r"chunk-001/file-000\.parquet: not a readable Parquet file"):
        open_dataset(str(root))


def test_no_episodes_parquet(root: Path) -> None:
    shutil.rmtree(root / "meta" / "episodes")
    with pytest.raises(DatasetFormatError, match=r"meta/episodes: no chunk-\*/file-\*\.parquet files found"):
        open_dataset(str(root))


def test_episode_table_errors(root: Path) -> None:
    ds = open_dataset(str(root))
    with pytest.raises(DatasetFormatError, match=r"data/chunk-000/file-000\.parquet: episode 1: column 'velocity' is missing"):
        ds.episode_table(1, columns=["velocity"])
    (root / "data" / "chunk-000" / "file-001.parquet").unlink()
    with pytest.raises(FetchError, match=r"data/chunk-000/file-001\.parquet: file not found"):
        ds.episode_table(3)


@pytest.mark.nginx
def test_http_gives_the_same_records_and_rows(source: Path, tmp_path: Path) -> None:
    local = open_dataset(str(source))
    with serve_directory(source, tmp_path / "nginx") as server:
        remote = open_dataset(server.url + "/")
        assert remote.root == server.url
        assert (remote.num_episodes, remote.fps, remote.video_keys) == (local.num_episodes, local.fps, local.video_keys)
        for i in range(local.num_episodes):
            assert remote.episode(i) == local.episode(i)
        assert remote.episode_table(5).equals(local.episode_table(5))
        assert server.requests("GET /videos/") == 0


def test_episode_table_truncated_data_file(root: Path) -> None:
    data = root / "data" / "chunk-000" / "file-000.parquet"
    data.write_bytes(data.read_bytes()[:-100])
    ds = open_dataset(str(root))
    with pytest.raises(DatasetFormatError, match=r"data/chunk-000/file-000\.parquet: episode 0: not a readable Parquet file"):
        ds.episode_table(0)


def test_episode_table_fetch_failure_mid_read_stays_a_fetch_error(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = open_dataset(str(source))
    real = ds.storage.read_range
    calls: list[tuple[int, int]] = []

    def failing_after_footer(rel: str, start: int, end: int) -> bytes:
        calls.append((start, end))
        if len(calls) > 1:
            raise FetchError(f"{rel}: injected failure")
        return real(rel, start, end)

    monkeypatch.setattr(ds.storage, "read_range", failing_after_footer)
    with pytest.raises(FetchError, match=r"^data/chunk-000/file-001\.parquet: injected failure$"):
        ds.episode_table(4)
    assert len(calls) == 2


@pytest.mark.nginx
def test_http_without_directory_listing_probes_episode_files(source: Path, tmp_path: Path) -> None:
    local = open_dataset(str(source))
    with serve_directory(source, tmp_path / "nginx") as server:
        remote = open_dataset(server.url + "/nolist")
        assert [remote.episode(i) for i in range(7)] == [local.episode(i) for i in range(7)]
        # chunk-000 holds files 000 and 001, chunk-001 holds 000: three hits, then 002, 001/001, 002/000 miss
        assert server.requests("HEAD /nolist/meta/episodes/") == 6
