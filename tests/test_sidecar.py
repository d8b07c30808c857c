"""The index sidecar: a second run reads no MP4 header; stale or corrupt sidecars are rebuilt."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from episodes import EpisodeByteCache, open_dataset
from episodes._sidecar import SIDECAR_NAME, IndexSidecar, default_cache_dir
from episodes.testing.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory
from tests.test_make_dataset import read_indices

SPEC = SyntheticSpec(codec="h264", gop=6, bframes=2, episodes=4, cameras=1, episodes_per_file=2,
                     min_length=8, max_length=16, width=64, height=64, seed=5)


def run_all(ds, **options) -> tuple[EpisodeByteCache, list[tuple[int, int]]]:
    """Read frame 0 of every episode; returns the closed cache and every (start, end) read from storage."""
    original, reads = ds.storage.read_range, []

    def counted(rel: str, start: int, end: int) -> bytes:
        reads.append((start, end))
        return original(rel, start, end)

    ds.storage.read_range = counted
    with EpisodeByteCache(ds, **options) as cache:
        key = ds.video_keys[0]
        for ep in range(ds.num_episodes):
            assert read_indices(cache.get_episode_frames(ep, key, [0])) == [ds.episode(ep).dataset_from_index]
    return cache, reads


def test_second_run_makes_zero_header_probes(root: Path) -> None:
    first, first_reads = run_all(open_dataset(str(root)))
    assert first.sidecar_path.is_file() and default_cache_dir() in first.sidecar_path.parents
    assert not (root / "meta" / SIDECAR_NAME).exists()  # never inside the user's dataset
    assert first.stats().index_builds == 2 and first.stats().header_reads > 0
    second, second_reads = run_all(open_dataset(str(root)))
    stats = second.stats()
    assert (stats.index_builds, stats.index_sidecar_loads, stats.header_reads) == (0, 2, 0)
    assert len(second_reads) == 4  # one payload range per episode, nothing else
    assert len(first_reads) == 4 + first.stats().header_reads


def test_touched_or_rewritten_file_is_reindexed(root: Path) -> None:
    run_all(open_dataset(str(root)))
    video = root / "videos/observation.images.cam0/chunk-000/file-001.mp4"
    stat = video.stat()
    os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    touched, _ = run_all(open_dataset(str(root)))
    assert (touched.stats().index_builds, touched.stats().index_sidecar_loads) == (1, 1)
    # Same size, other bytes: re-encode with faststart so the moov moves and stale offsets would be wrong.
    make_dataset(root.parent / "fast", SyntheticSpec(**{**SPEC.__dict__, "faststart": True}))
    shutil.copyfile(root.parent / "fast" / video.relative_to(root), video)
    assert video.stat().st_size == stat.st_size
    rewritten, _ = run_all(open_dataset(str(root)))
    assert rewritten.stats().index_builds == 1
    again, _ = run_all(open_dataset(str(root)))
    assert again.stats().index_builds == 0


@pytest.mark.parametrize("damage", [b"", b"not an npz file at all", b"PK\x03\x04 truncated zip"])
def test_corrupt_sidecar_is_ignored_and_rewritten(root: Path, damage: bytes) -> None:
    first, _ = run_all(open_dataset(str(root)))
    first.sidecar_path.write_bytes(damage)
    rebuilt, _ = run_all(open_dataset(str(root)))
    assert rebuilt.stats().index_builds == 2
    assert len(IndexSidecar(rebuilt.sidecar_path)._entries) == 2
    third, _ = run_all(open_dataset(str(root)))
    assert third.stats().header_reads == 0


@pytest.mark.nginx
def test_remote_root_keeps_its_sidecar_in_the_cache_dir(root: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    with serve_directory(root, tmp_path / "nginx") as server:
        first, _ = run_all(open_dataset(server.url), sidecar_dir=cache_dir)
        path = first.sidecar_path
        assert path.parent.parent == cache_dir and path.name == SIDECAR_NAME and path.is_file()
        assert not (root / "meta" / SIDECAR_NAME).exists()
        second, reads = run_all(open_dataset(server.url), sidecar_dir=cache_dir)
        assert second.sidecar_path == path and second.stats().header_reads == 0 and len(reads) == 4
        with EpisodeByteCache(open_dataset(server.url), sidecar_dir=cache_dir) as cache:
            remote = cache.get_episode_frames(3, "observation.images.cam0", [0, 1])
    with EpisodeByteCache(open_dataset(str(root)), use_sidecar=False) as local:
        assert local.sidecar_path is None
        assert torch.equal(remote, local.get_episode_frames(3, "observation.images.cam0", [0, 1]))
