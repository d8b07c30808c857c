"""EpisodeByteCache: bit-identical frames for every episode and codec, timestamp mapping, LRU, shared fetches."""
from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from episodes import EpisodeByteCache, Fetch, FrameRequest, decode_mini_mp4, open_dataset, open_video_files
from episodes._sidecar import sidecar_path
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.tools.verify import FullFileReference
from tests.support.mp4_fixtures import read_indices

SMALL = dict(episodes=5, cameras=1, episodes_per_file=2, min_length=8, max_length=20, width=64, height=64, seed=3)
KINDS = {
    "h264_bframes_moov_end": SyntheticSpec(codec="h264", gop=6, bframes=2, **{**SMALL, "cameras": 2}),
    "h264_faststart_no_bframes": SyntheticSpec(codec="h264", gop=5, bframes=0, faststart=True, **SMALL),
    "hevc_bframes": SyntheticSpec(codec="hevc", gop=8, bframes=3, **{**SMALL, "episodes": 4}),
    "av1_gop2": SyntheticSpec(codec="av1", gop=2, **{**SMALL, "episodes": 3}),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("cache_datasets")
    return {kind: make_dataset(base / kind, spec) for kind, spec in KINDS.items()}


def wait_until(condition, what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_episode_matches_the_full_file_decode(roots: dict[str, Path], kind: str, tmp_path: Path) -> None:
    ds = open_dataset(str(roots[kind]))
    files = {ds.episode(e).videos[k].path for e in range(ds.num_episodes) for k in ds.video_keys}
    assert len(files) > 1, "episodes must spread over several files"
    reference = FullFileReference(ds)
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        for key in ds.video_keys:
            for ep in range(ds.num_episodes):
                record = ds.episode(ep)
                n = record.length
                picks = sorted({0, 1, n // 2, n - 2, n - 1})
                ours = cache.read_frames([FrameRequest(ep, key, frame_numbers=picks)])[0].frames
                assert ours.dtype == torch.uint8 and ours.shape == (len(picks), 3, 64, 64)
                assert torch.equal(ours, reference.frames(ep, key, picks)), (kind, key, ep)
                assert read_indices(ours) == [record.dataset_from_index + p for p in picks]
        stats = cache.stats()
    reference.close()
    assert stats.misses == ds.num_episodes * len(ds.video_keys) and stats.hits == 0
    assert stats.index_builds == len(files)
    assert stats.frames_decoded > 0 and stats.bytes_fetched > 0


def test_timestamps_map_to_the_nearest_frame(roots: dict[str, Path], tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    key = ds.video_keys[1]
    record = ds.episode(3)
    n = record.length
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        exact = [k / ds.fps for k in range(n)]
        accumulated = np.cumsum([0.0] + [1 / ds.fps] * (n - 1))  # floats off by a few ulps
        nudged = [k / ds.fps + d / ds.fps for k, d in zip(range(n), np.resize([0.4, -0.4, 0.1, -0.49], n))]
        expected = list(range(record.dataset_from_index, record.dataset_to_index))
        for timestamps in (exact, accumulated, nudged, torch.tensor(exact)):
            assert read_indices(cache.get_frames(3, key, timestamps)) == expected
        assert read_indices(cache.get_frames(3, key, [(n - 1) / ds.fps, 0.0, 2 / ds.fps])) == [
            expected[-1], expected[0], expected[2]]
        url = f"{ds.root}/{record.videos[key].path}"
        for bad in (-0.6 / ds.fps, (n - 0.4) / ds.fps):
            with pytest.raises(ValueError, match=rf"^{url}: episode 3, camera {key}: timestamp .* is not within"
                                                 rf" half a frame of any of the episode's {n} frames"):
                cache.get_frames(3, key, [0.0, bad])
        with pytest.raises(IndexError, match=rf": episode 3, camera {key}: frame {n} is out of range"):
            cache.read_frames([FrameRequest(3, key, frame_numbers=[n])])


def test_lru_evicts_oldest_under_a_small_budget(roots: dict[str, Path], tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_faststart_no_bframes"]))
    key = ds.video_keys[0]
    with EpisodeByteCache(ds, cache_dir=tmp_path) as probe:
        sizes = [len(probe.fetch_frames([FrameRequest(ep, key)])[0].mini.data) for ep in range(3)]
    budget = sizes[1] + sizes[2]  # room for episodes 1 and 2, not 0 as well
    with EpisodeByteCache(ds, byte_budget=budget, cache_dir=tmp_path) as cache:
        first = cache.read_frames([FrameRequest(0, key, frame_numbers=[0])])[0]
        assert not first.cache_hit and first.bytes_fetched > 0
        cache.fetch_frames([FrameRequest(1, key), FrameRequest(2, key)])
        stats = cache.stats()
        assert (stats.misses, stats.evictions, stats.cached_items) == (3, 1, 2)
        assert stats.cached_bytes == budget
        again = cache.read_frames([FrameRequest(2, key, frame_numbers=[0, 1])])[0]
        assert again.cache_hit and again.bytes_fetched == 0 and again.frames_decoded == 2
        assert not cache.fetch_frames([FrameRequest(0, key, frame_numbers=[0])])[0].cache_hit  # evicted: fetched again
        # Episode 0 pushes out the least recent (1), and 2 as well when 0 and 2 exceed the budget.
        evicted = 1 if sizes[0] + sizes[2] <= budget else 2
        stats = cache.stats()
        assert (stats.evictions, stats.hits, stats.cached_items) == (1 + evicted, 1, 3 - evicted)
        assert stats.cached_bytes == sizes[0] + (sizes[2] if evicted == 1 else 0)
    with EpisodeByteCache(ds, byte_budget=min(sizes) - 1, cache_dir=tmp_path) as tiny:
        tiny.fetch_frames([FrameRequest(0, key)])
        assert tiny.stats().cached_items == 0 and tiny.stats().cached_bytes == 0


def test_concurrent_requests_share_one_fetch(roots: dict[str, Path], tmp_path: Path) -> None:
    ds = open_dataset(str(roots["hevc_bframes"]))
    key = ds.video_keys[0]
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        cache.index_files([ds.episode(2).videos[key].path])
        original, entered, release, calls = ds.storage.read_range, threading.Event(), threading.Event(), []

        def gated(rel: str, start: int, end: int) -> bytes:
            calls.append((rel, start, end))
            entered.set()
            release.wait(30)
            return original(rel, start, end)

        ds.storage.read_range = gated
        try:
            results: list[torch.Tensor] = []
            request = FrameRequest(2, key, frame_numbers=[0, 5])
            threads = [threading.Thread(target=lambda: results.append(cache.read_frames([request])[0].frames))
                       for _ in range(2)]
            threads[0].start()
            assert entered.wait(30)
            threads[1].start()
            wait_until(lambda: cache.stats().shared_fetches == 1, "the second request to join the fetch")
            release.set()
            for t in threads:
                t.join(30)
        finally:
            del ds.storage.read_range
        assert len(calls) == 1 and len(results) == 2 and torch.equal(results[0], results[1])
        stats = cache.stats()
        assert (stats.misses, stats.shared_fetches, stats.hits) == (1, 1, 0)


def test_prefetch_fills_the_cache_and_mini_mp4s_travel_between_processes(roots: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    with EpisodeByteCache(ds, workers=2, cache_dir=tmp_path) as cache:
        futures = cache.prefetch(4)
        assert len(futures) == 2
        minis = [f.result(timeout=60) for f in futures]
        assert cache.stats().misses == 2
        for key, mini in zip(ds.video_keys, minis):
            read = cache.read_frames([FrameRequest(4, key, frame_numbers=range(mini.num_frames))])[0]
            assert read.cache_hit
            copy = pickle.loads(pickle.dumps(mini))
            assert torch.equal(decode_mini_mp4(copy, range(copy.num_frames)), read.frames)
    with pytest.raises(RuntimeError, match="^the EpisodeByteCache is closed$"):
        cache.fetch_frames([FrameRequest(0, ds.video_keys[0])])


@pytest.mark.parametrize("fetch", ["episode", "windows"])
def test_a_read_is_a_fetch_then_a_decode_and_fetched_frames_travel_between_processes(
        roots: dict[str, Path], tmp_path: Path, fetch: Fetch) -> None:
    ds = open_dataset(str(roots["hevc_bframes"]))
    key = ds.video_keys[0]
    n = ds.episode_length(1)
    requests = [FrameRequest(1, key), FrameRequest(1, key, frame_numbers=[n - 1, 0, 0]),
                FrameRequest(2, key, timestamps=[1 / ds.fps])]
    reference = FullFileReference(ds)
    every, picked, stamped = (reference.frames(1, key, range(n)), reference.frames(1, key, [n - 1, 0, 0]),
                              reference.frames(2, key, [1]))
    reference.close()
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        reads = cache.read_frames(requests, fetch=fetch)
    assert [read.frames.shape[0] for read in reads] == [n, 3, 1]  # neither timestamps nor numbers: every frame
    for read, expected in zip(reads, (every, picked, stamped)):
        assert torch.equal(read.frames, expected)
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        fetched = cache.fetch_frames(requests, fetch=fetch)
        paid = cache.stats()
        assert paid.frames_decoded == 0 and paid.bytes_fetched == sum(f.bytes_fetched for f in fetched) > 0
        assert [f.frame_numbers.tolist() for f in fetched] == [list(range(n)), [n - 1, 0, 0], [1]]
        decoded = [cache.decode_frames(f) for f in fetched]
        assert cache.stats().bytes_fetched == paid.bytes_fetched  # decoding looks nothing up and fetches nothing
    for got, read, later in zip(fetched, reads, decoded):
        assert torch.equal(later.frames, read.frames) and later.bytes_fetched == got.bytes_fetched
        copy = pickle.loads(pickle.dumps(got))  # what a fetch process hands a decode process
        assert torch.equal(decode_mini_mp4(copy.mini, copy.frame_numbers), read.frames)
    with pytest.raises(TypeError, match="^pass timestamps or frame_numbers, not both$"):
        FrameRequest(1, key, timestamps=[0.0], frame_numbers=[0])


def test_index_files_readies_the_indexes_before_any_read(roots: dict[str, Path], tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    paths = sorted({ds.episode(e).videos[k].path for e in range(ds.num_episodes) for k in ds.video_keys})
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        cache.index_files(paths)
        built = cache.stats()
        cache.read_frames([FrameRequest(e, k, frame_numbers=[0]) for e in range(ds.num_episodes) for k in ds.video_keys])
        assert (built.index_builds, built.header_reads > 0, built.bytes_fetched) == (len(paths), True, 0)
        assert (cache.stats().index_builds, cache.stats().header_reads) == (built.index_builds, built.header_reads)
    with EpisodeByteCache(ds, cache_dir=tmp_path) as again:
        again.index_files(paths)
        assert (again.stats().index_sidecar_loads, again.stats().header_reads) == (len(paths), 0)


def test_plain_video_files_work_as_one_episode_datasets(roots: dict[str, Path], tmp_path: Path) -> None:
    root = roots["av1_gop2"]
    videos = open_video_files(str(root / "videos" / "*" / "chunk-000" / "*.mp4"))
    assert videos.num_episodes == 2 and videos.video_keys == ("video",)
    ds = open_dataset(str(root))
    key = ds.video_keys[0]
    first_file = [ep for ep in range(ds.num_episodes) if ds.episode(ep).videos[key].path.endswith("file-000.mp4")]
    expected = [i for ep in first_file for i in range(ds.episode(ep).dataset_from_index, ds.episode(ep).dataset_to_index)]
    assert videos.episode_length(0) == len(expected) and videos.fps == pytest.approx(30.0)
    with EpisodeByteCache(videos, cache_dir=tmp_path) as cache:
        frames = cache.get_frames(0, "video", np.arange(len(expected)) / videos.fps)
    assert read_indices(frames) == expected
    assert sidecar_path(videos.storage, tmp_path).is_file()  # under cache_dir: no meta/ among the user's videos


@pytest.mark.gpu
def test_nvdec_decode_is_cpu_decoding_within_torchcodec_s_tolerance_for_h264(roots: dict[str, Path], tmp_path: Path) -> None:
    """NVDEC's colour conversion is not FFmpeg's: every value within 3 of 255, torchcodec's own CUDA 13 tolerance."""
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    key = ds.video_keys[0]
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        for ep in range(ds.num_episodes):
            n = ds.episode_length(ep)
            picks = [0, n // 2, n - 1]
            gpu = cache.read_frames([FrameRequest(ep, key, frame_numbers=picks)], device="cuda:0")[0]
            assert gpu.frames.device.type == "cuda" and gpu.backend.device == "nvdec", gpu.backend
            cpu = cache.read_frames([FrameRequest(ep, key, frame_numbers=picks)])[0]
            assert cpu.backend.device == "cpu"
            assert (gpu.frames.cpu().int() - cpu.frames.int()).abs().max() <= 3
