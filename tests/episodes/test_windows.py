"""Frame windows: only the samples the asked-for frames need, coalesced ranges, frames bit-identical, exact byte counts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from episodes import EpisodeByteCache, FetchError, FrameRequest, decode_mini_mp4, open_dataset
from episodes._mp4.span import episode_span
from episodes._mp4.windows import frame_windows
from episodes._mp4.writer import build_mini_mp4, gather_samples
from episodes._storage import coalesce_ranges
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory
from episodes.tools.verify import FullFileReference
from tests.support.mp4_fixtures import ALL_KINDS, FPS, FRAMES, clip_dir, full_decoder, make_mp4, read_index

__all__ = ["clip_dir"]

SMALL = dict(episodes=5, cameras=1, episodes_per_file=3, min_length=8, max_length=24, width=64, height=64, seed=3)
KINDS = {
    "h264_bframes_moov_end": SyntheticSpec(codec="h264", gop=6, bframes=2, **SMALL),
    "h264_faststart_no_bframes": SyntheticSpec(codec="h264", gop=5, bframes=0, faststart=True, **SMALL),
    "hevc_bframes_open_gop": SyntheticSpec(codec="hevc", gop=8, bframes=3, **SMALL),
    "av1_gop2": SyntheticSpec(codec="av1", gop=2, **SMALL),
    "av1_gop8": SyntheticSpec(codec="av1", gop=8, **SMALL),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("window_datasets")
    return {kind: make_dataset(base / kind, spec) for kind, spec in KINDS.items()}


def window_mini(path: Path, numbers: list[int]):
    """The whole clip as one episode, a mini-MP4 of the windows of `numbers` built from the file's bytes."""
    index = read_index(path)
    start = index.pts.min() / index.timescale
    span = episode_span(index, start, start + FRAMES / FPS, expected_frames=FRAMES)
    windows = frame_windows(index, span, np.array(numbers))
    data = path.read_bytes()
    parts = [gather_samples(index, np.arange(r.start, r.stop), data, 0) for r in windows.runs]
    return build_mini_mp4(index, windows.samples, b"".join(parts), windows.frame_samples, windows.frame_numbers,
                          FRAMES), windows


@pytest.mark.slow
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_frame_alone_decodes_bit_identically_from_its_window(clip_dir: Path, kind: str) -> None:
    """B-frames, negative composition offsets, edit lists, open-GOP leading pictures, AV1, interleaved audio."""
    path = make_mp4(clip_dir, kind)
    reference = full_decoder(path).get_frames_at(list(range(FRAMES))).data
    for n in range(FRAMES):
        mini, windows = window_mini(path, [n])
        assert len(windows.windows) == len(windows.runs) == 1
        assert windows.runs[0].stop == windows.frame_samples[0] + 1  # the window ends at the frame itself
        assert torch.equal(decode_mini_mp4(mini, [n]), reference[n : n + 1]), (kind, n)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_scattered_frames_share_one_mini_mp4_of_disjoint_runs(clip_dir: Path, kind: str) -> None:
    path = make_mp4(clip_dir, kind)
    reference = full_decoder(path).get_frames_at(list(range(FRAMES))).data
    rng = np.random.default_rng(7)
    for picks in ([0, FRAMES - 1], [3, 4, 40, 41, 70], sorted(rng.choice(FRAMES, 9, replace=False).tolist())):
        mini, windows = window_mini(path, picks)
        assert len(windows.runs) >= 2 and mini.num_frames == len(picks)
        assert torch.equal(decode_mini_mp4(mini, picks[::-1]), reference[picks[::-1]]), (kind, picks)
        assert len(mini.data) < path.stat().st_size
    with pytest.raises(IndexError, match="episode frame 1 is not among the 2 frames this frame-window mini-MP4 holds"):
        decode_mini_mp4(window_mini(path, [0, 5])[0], [1])
    with pytest.raises(IndexError, match=f"episode frame {FRAMES} is out of range: the episode has {FRAMES} frames"):
        decode_mini_mp4(window_mini(path, [0, 5])[0], [FRAMES])


def test_an_open_gop_leading_picture_starts_one_keyframe_earlier(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "hevc_bframes")
    index = read_index(path)
    sync = np.flatnonzero(index.is_sync)
    leading = [s + 1 for s in sync[1:] if index.pts[s + 1] < index.pts[s]]
    assert leading, "x265's open GOPs give CRA pictures leading pictures"
    start = index.pts.min() / index.timescale
    span = episode_span(index, start, start + FRAMES / FPS)
    for sample in leading:
        frame = span.frames.index(sample)
        run = frame_windows(index, span, np.array([frame])).runs[0]
        cra = sync[np.searchsorted(sync, sample) - 1]
        assert run.start == sync[np.searchsorted(sync, cra) - 1] and run.stop == sample + 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_windows_equal_the_full_file_decode_for_every_frame_of_every_episode(roots: dict[str, Path], kind: str,
                                                                             tmp_path: Path) -> None:
    ds = open_dataset(str(roots[kind]))
    key = ds.video_keys[0]
    reference = FullFileReference(ds)
    with EpisodeByteCache(ds, cache_dir=tmp_path, coalesce_gap=0) as cache:
        for ep in range(ds.num_episodes):
            n = ds.episode_length(ep)
            expected = reference.frames(ep, key, range(n))
            for f in range(n):
                (read,) = cache.read_frames([FrameRequest(ep, key, frame_numbers=[f])], fetch="windows")
                assert torch.equal(read.frames, expected[f : f + 1])
            picks = [n - 1, 0, n // 2, n // 2 + 1]
            (read,) = cache.read_frames([FrameRequest(ep, key, frame_numbers=picks)], fetch="windows")
            assert torch.equal(read.frames, expected[picks])
            stamps = [p / ds.fps for p in picks]
            assert torch.equal(cache.get_frames(ep, key, stamps, fetch="windows"), expected[picks])
        assert cache.stats().cached_items == 0  # windows are not kept
    reference.close()


def test_a_batch_coalesces_across_episodes_of_one_file_and_counts_every_byte(roots: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    key = ds.video_keys[0]
    rng = np.random.default_rng(1)
    requests = [FrameRequest(ep, key, frame_numbers=rng.choice(ds.episode_length(ep), 3, replace=False))
                for ep in range(ds.num_episodes)]
    reference = FullFileReference(ds)
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        planned: dict[str, list[tuple[int, int]]] = {}
        for r in requests:
            seg = ds.episode(r.episode).videos[key]
            index = read_index(roots["h264_bframes_moov_end"] / seg.path)
            span = episode_span(index, seg.from_timestamp, seg.to_timestamp)
            runs = frame_windows(index, span, r.frame_numbers).runs
            planned.setdefault(seg.path, []).extend((run.byte_start, run.byte_end) for run in runs)
        for gap, expected_requests in ((0, None), (10**9, len(planned))):
            before = cache.stats()
            reads = cache.read_frames(requests, fetch="windows", coalesce_gap=gap)
            after = cache.stats()
            merged = {rel: coalesce_ranges(ranges, gap) for rel, ranges in planned.items()}
            requests_made = sum(len(m) for m in merged.values())
            assert after.range_requests - before.range_requests == requests_made
            assert expected_requests is None or requests_made == expected_requests
            fetched = sum(e - s for m in merged.values() for s, e in m)
            assert sum(r.bytes_fetched for r in reads) == after.bytes_fetched - before.bytes_fetched == fetched
            assert after.windows - before.windows == 3 * len(requests)
            for request, read in zip(requests, reads):
                expected = reference.frames(request.episode, key, request.frame_numbers)
                assert torch.equal(read.frames, expected) and not read.cache_hit and read.bytes_reused == 0
    reference.close()


def test_prefetched_bytes_are_charged_to_the_first_read_and_reused_after(roots: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    ds = open_dataset(str(roots["av1_gop2"]))
    key = ds.video_keys[0]
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        mini = cache.prefetch(2, [key])[0].result(timeout=60)
        fetched = cache.stats().bytes_fetched
        assert fetched > 0 and cache.stats().bytes_reused == 0
        first = cache.read_frames([FrameRequest(2, key, frame_numbers=[0, 3])])[0]
        assert first.cache_hit and first.bytes_fetched == fetched and first.bytes_reused == 0
        second = cache.read_frames([FrameRequest(2, key, frame_numbers=[1])])[0]
        assert second.bytes_fetched == 0 and second.bytes_reused == fetched
        # A windows read of an episode already cached decodes from it: nothing fetched.
        windows = cache.read_frames([FrameRequest(2, key, frame_numbers=[4])], fetch="windows")[0]
        assert windows.cache_hit and (windows.bytes_fetched, windows.bytes_reused) == (0, fetched)
        assert torch.equal(windows.frames, decode_mini_mp4(mini, [4]))
        assert cache.stats().bytes_fetched == fetched and cache.stats().bytes_reused == 2 * fetched
        own = cache.read_frames([FrameRequest(1, key, frame_numbers=[0])])[0]
        assert not own.cache_hit and own.bytes_fetched > 0
        assert cache.stats().bytes_fetched == fetched + own.bytes_fetched


def test_bad_window_requests_name_file_episode_and_camera(roots: dict[str, Path], tmp_path: Path) -> None:
    root = roots["h264_faststart_no_bframes"]
    ds = open_dataset(str(root))
    key = ds.video_keys[0]
    n = ds.episode_length(1)
    url = f"{ds.root}/{ds.episode(1).videos[key].path}"
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        with pytest.raises(IndexError, match=rf"^{url}: episode 1, camera {key}: frame {n} is out of range"):
            cache.read_frames([FrameRequest(1, key, frame_numbers=[0, n])], fetch="windows")
        with pytest.raises(ValueError, match=rf"^{url}: episode 1, camera {key}: timestamp .* is not within half"):
            cache.get_frames(1, key, [(n + 0.6) / ds.fps], fetch="windows")
        with pytest.raises(ValueError, match=rf"^{url}: episode 1, camera {key}: no frames were asked for"):
            cache.read_frames([FrameRequest(1, key, frame_numbers=[])], fetch="windows")
        with pytest.raises(ValueError, match="^fetch must be one of episode, windows, not 'gops'$"):
            cache.read_frames([FrameRequest(1, key, frame_numbers=[0])], fetch="gops")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="^coalesce_gap must be >= 0 bytes, not -1$"):
            cache.read_frames([FrameRequest(1, key, frame_numbers=[0])], fetch="windows", coalesce_gap=-1)
        with pytest.raises(ValueError, match=rf"episode 1: camera 'nope' is not one of {key}"):
            cache.read_frames([FrameRequest(1, "nope", frame_numbers=[0])], fetch="windows")
        cache.index_files([ds.episode(1).videos[key].path])  # the index outlives what follows
        video = root / ds.episode(1).videos[key].path
        data = video.read_bytes()
        video.write_bytes(data[: len(data) // 2])  # the file shrinks under a known index
        try:
            with pytest.raises(FetchError, match=rf"^{url}: episode \d, camera {key}: read of bytes \[\d+, \d+\) "
                                                 r"returned \d+ bytes, expected \d+"):
                cache.read_frames([FrameRequest(e, key, frame_numbers=[ds.episode_length(e) - 1]) for e in range(3)],
                                  fetch="windows")
        finally:
            video.write_bytes(data)


@pytest.mark.nginx
def test_windows_over_http_make_one_request_per_coalesced_range(roots: dict[str, Path], tmp_path: Path) -> None:
    root = roots["hevc_bframes_open_gop"]
    local = open_dataset(str(root))
    key = local.video_keys[0]
    requests = [FrameRequest(ep, key, frame_numbers=[0, local.episode_length(ep) - 1]) for ep in range(3)]
    reference = FullFileReference(local)
    with serve_directory(root, tmp_path / "nginx") as server:
        remote = open_dataset(server.url)
        rel = remote.episode(0).videos[key].path
        with EpisodeByteCache(remote, cache_dir=tmp_path / "sidecar", coalesce_gap=10**9) as cache:
            cache.index_files([rel])
            before = server.requests(rel)
            reads = cache.read_frames(requests, fetch="windows")
            assert server.requests(rel) - before == 1  # three episodes of one file: one range request
        for request, read in zip(requests, reads):
            assert torch.equal(read.frames, reference.frames(request.episode, key, request.frame_numbers))
    reference.close()


@pytest.mark.gpu
def test_windows_decode_on_nvdec_equals_the_cpu(roots: dict[str, Path], tmp_path: Path) -> None:
    ds = open_dataset(str(roots["h264_bframes_moov_end"]))
    key = ds.video_keys[0]
    requests = [FrameRequest(ep, key, frame_numbers=[0, ds.episode_length(ep) // 2, ds.episode_length(ep) - 1])
                for ep in range(ds.num_episodes)]
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        gpu = cache.read_frames(requests, fetch="windows", device="cuda:0")
        cpu = cache.read_frames(requests, fetch="windows")
    for on_gpu, on_cpu in zip(gpu, cpu):
        assert on_gpu.frames.device.type == "cuda" and torch.equal(on_gpu.frames.cpu(), on_cpu.frames)
