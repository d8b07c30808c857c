"""The index sidecar: a second run reads no MP4 header; stale or corrupt sidecars are rebuilt; none without a cache_dir."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from episodes import EpisodeByteCache, Fetch, FrameRequest, LeRobotDataset, Storage, open_dataset
from episodes._indexes import FileClaim, StaleIndex
from episodes._sidecar import SIDECAR_NAME, IndexSidecar, sidecar_path
from episodes._storage import FileInfo
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory
from tests.support.mp4_fixtures import read_indices

SPEC = SyntheticSpec(codec="h264", gop=6, bframes=2, episodes=4, cameras=1, episodes_per_file=2,
                     min_length=8, max_length=16, width=64, height=64, seed=5)


def run_all(ds: LeRobotDataset, cache_dir: Path | None) -> tuple[EpisodeByteCache, list[tuple[int, int]]]:
    """Read frame 0 of every episode; returns the closed cache and every (start, end) read from storage."""
    original, reads = ds.storage.read_range, []

    def counted(rel: str, start: int, end: int) -> bytes:
        reads.append((start, end))
        return original(rel, start, end)

    ds.storage.read_range = counted
    with EpisodeByteCache(ds, cache_dir=cache_dir) as cache:
        key = ds.video_keys[0]
        got = cache.read_frames([FrameRequest(ep, key, frame_numbers=[0]) for ep in range(ds.num_episodes)])
        assert [read_indices(read.frames) for read in got] == [
            [ds.episode(ep).dataset_from_index] for ep in range(ds.num_episodes)]
    return cache, reads


def test_second_run_makes_zero_header_probes(root: Path, tmp_path: Path) -> None:
    ds = open_dataset(str(root))
    first, first_reads = run_all(ds, tmp_path)
    assert sidecar_path(ds.storage, tmp_path).is_file() and sidecar_path(ds.storage, tmp_path).name == SIDECAR_NAME
    assert not (root / "meta" / SIDECAR_NAME).exists()  # never inside the user's dataset
    assert first.stats().index_builds == 2 and first.stats().header_reads > 0
    second, second_reads = run_all(open_dataset(str(root)), tmp_path)
    stats = second.stats()
    assert (stats.index_builds, stats.index_sidecar_loads, stats.header_reads) == (0, 2, 0)
    assert len(second_reads) == 4  # one payload range per episode, nothing else
    assert len(first_reads) == 4 + first.stats().header_reads


def test_touched_or_rewritten_file_is_reindexed(root: Path, tmp_path: Path) -> None:
    run_all(open_dataset(str(root)), tmp_path)
    video = root / "videos/observation.images.cam0/chunk-000/file-001.mp4"
    stat = video.stat()
    os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    touched, _ = run_all(open_dataset(str(root)), tmp_path)
    assert (touched.stats().index_builds, touched.stats().index_sidecar_loads) == (1, 1)
    # Same size, other bytes: re-encode with faststart so the moov moves and stale offsets would be wrong.
    make_dataset(root.parent / "fast", SyntheticSpec(**{**SPEC.__dict__, "faststart": True}))
    shutil.copyfile(root.parent / "fast" / video.relative_to(root), video)
    assert video.stat().st_size == stat.st_size
    rewritten, _ = run_all(open_dataset(str(root)), tmp_path)
    assert rewritten.stats().index_builds == 1
    again, _ = run_all(open_dataset(str(root)), tmp_path)
    assert again.stats().index_builds == 0


@pytest.mark.parametrize("damage", [b"", b"not an npz file at all", b"PK\x03\x04 truncated zip"])
def test_corrupt_sidecar_is_ignored_and_rewritten(root: Path, tmp_path: Path, damage: bytes) -> None:
    ds = open_dataset(str(root))
    path = sidecar_path(ds.storage, tmp_path)
    run_all(ds, tmp_path)
    path.write_bytes(damage)
    rebuilt, _ = run_all(open_dataset(str(root)), tmp_path)
    assert rebuilt.stats().index_builds == 2
    assert len(IndexSidecar(path)._entries) == 2
    third, _ = run_all(open_dataset(str(root)), tmp_path)
    assert third.stats().header_reads == 0


@pytest.mark.nginx
def test_remote_root_keeps_its_sidecar_in_the_cache_dir(root: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    with serve_directory(root, tmp_path / "nginx") as server:
        ds = open_dataset(server.url)
        run_all(ds, cache_dir)
        path = sidecar_path(ds.storage, cache_dir)
        assert path.parent.parent == cache_dir and path.name == SIDECAR_NAME and path.is_file()
        assert not (root / "meta" / SIDECAR_NAME).exists()
        gets = server.requests("GET /videos/")
        second, _ = run_all(open_dataset(server.url), cache_dir)
        assert second.stats().header_reads == 0 and server.requests("GET /videos/") - gets == 4
        assert server.requests("HEAD /videos/") == 2  # the first run's; the second's answers checked the files
        request = FrameRequest(3, "observation.images.cam0", frame_numbers=[0, 1])
        with EpisodeByteCache(open_dataset(server.url), cache_dir=cache_dir) as cache:
            remote = cache.read_frames([request])[0].frames
    with EpisodeByteCache(open_dataset(str(root))) as local:
        assert torch.equal(remote, local.read_frames([request])[0].frames)


@pytest.mark.nginx
@pytest.mark.parametrize("fetch", ["episode", "windows"])
def test_a_file_rewritten_behind_a_remote_sidecar_is_found_by_the_first_range_answer(
        root: Path, tmp_path: Path, fetch: Fetch) -> None:
    """Over HTTP the sidecar's indexes are used at once; the first range answer of a file (its Content-Range total
    and ETag) finds it rewritten: its index is rebuilt from the file as it is now and its reads made again."""
    cache_dir = tmp_path / "cache"
    video = root / "videos/observation.images.cam0/chunk-000/file-001.mp4"   # episodes 2 and 3
    with serve_directory(root, tmp_path / "nginx") as server:
        run_all(open_dataset(server.url), cache_dir)
        heads = server.requests("HEAD /videos/")
        # Same size, other bytes: re-encode with faststart so the moov moves and stale offsets would be wrong.
        make_dataset(root.parent / "fast", SyntheticSpec(**{**SPEC.__dict__, "faststart": True}))
        stat = video.stat()
        shutil.copyfile(root.parent / "fast" / video.relative_to(root), video)
        os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # another ETag, whatever the clock
        assert video.stat().st_size == stat.st_size
        ds = open_dataset(server.url)
        key = ds.video_keys[0]
        requests = [FrameRequest(ep, key, frame_numbers=[0, ds.episode_length(ep) - 1]) for ep in range(4)]
        with EpisodeByteCache(ds, cache_dir=cache_dir, coalesce_gap=0) as cache:
            got = [read.frames for read in cache.read_frames(requests, fetch=fetch)]
            stats = cache.stats()
        assert server.requests("HEAD /videos/") - heads == 1   # the rewritten file's, to index it afresh
    assert [read_indices(frames) for frames in got] == [
        [ds.episode(ep).dataset_from_index, ds.episode(ep).dataset_to_index - 1] for ep in range(4)]
    assert (stats.index_sidecar_stale, stats.index_sidecar_loads, stats.index_builds) == (1, 1, 1)
    assert stats.header_reads > 0


class _Infos(Storage):
    """A storage whose `info` is counted and answers `current`."""

    def __init__(self, current: FileInfo) -> None:
        self.current, self.asked = current, 0

    def info(self, rel: str) -> FileInfo:
        self.asked += 1
        return self.current


def test_a_claim_is_settled_once_by_the_answer_or_by_the_files_info_where_the_answer_cannot_say() -> None:
    stored = FileInfo(100, '"abc"')
    storage, stale = _Infos(stored), []
    claim = FileClaim(storage, "v.mp4", stored, stale.append)
    claim.settle(FileInfo(100, '"abc"'))
    claim.settle(FileInfo(7, None))   # settled already: later answers are not asked
    assert storage.asked == 0 and stale == []
    for answer in (None, FileInfo(100, None)):   # not stated, or no version where the sidecar has one
        storage = _Infos(FileInfo(100, '"new"'))
        claim = FileClaim(storage, "v.mp4", stored, stale.append)
        for _ in range(2):
            with pytest.raises(StaleIndex):
                claim.settle(answer)
        assert storage.asked == 1 and stale[-1] is claim
    claim = FileClaim(_Infos(stored), "v.mp4", stored, stale.append)
    with pytest.raises(StaleIndex):
        claim.settle(FileInfo(101, '"abc"'))
    assert len(stale) == 3


def test_without_a_cache_dir_nothing_is_written_and_each_cache_reads_the_headers(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The library has no default directory: neither RnB's variable nor the home directory is consulted.
    monkeypatch.setenv("RNB_CACHE_DIR", str(tmp_path / "rnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for _ in range(2):
        cache, _ = run_all(open_dataset(str(root)), None)
        assert (cache.stats().index_builds, cache.stats().index_sidecar_loads) == (2, 0)
        assert cache.stats().header_reads > 0
    assert not (tmp_path / "rnb").exists() and not (tmp_path / "home").exists()
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
