"""The index sidecar: a second run reads no MP4 header; stale or corrupt sidecars are rebuilt; none without a cache_dir."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from episodes import EpisodeByteCache, FrameRequest, LeRobotDataset, open_dataset
from episodes._sidecar import SIDECAR_NAME, IndexSidecar, sidecar_path
from episodes.testing.server import serve_directory
from episodes.testing.synthetic import SyntheticSpec, make_dataset
from tests.test_make_dataset import read_indices

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
        second, reads = run_all(open_dataset(server.url), cache_dir)
        assert second.stats().header_reads == 0 and len(reads) == 4
        request = FrameRequest(3, "observation.images.cam0", frame_numbers=[0, 1])
        with EpisodeByteCache(open_dataset(server.url), cache_dir=cache_dir) as cache:
            remote = cache.read_frames([request])[0].frames
    with EpisodeByteCache(open_dataset(str(root))) as local:
        assert torch.equal(remote, local.read_frames([request])[0].frames)


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
