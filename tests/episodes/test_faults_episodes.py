"""Every fault on the episode path is one clear exception naming the file and the episode; the cache lives on."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from episodes import EpisodeByteCache, FetchError, FrameRequest, LeRobotDataset, Mp4FormatError, open_dataset
from episodes._storage import Storage
from episodes.synthetic import SyntheticSpec
from episodes.testing.server import serve_directory
from tests.support.mp4_fixtures import read_indices

SPEC = SyntheticSpec(codec="h264", gop=6, bframes=2, episodes=4, cameras=1, episodes_per_file=2,
                     min_length=8, max_length=16, width=64, height=64, seed=9)
KEY = "observation.images.cam0"
BROKEN = "videos/observation.images.cam0/chunk-000/file-001.mp4"  # episodes 2 and 3


def expect_fault(ds: LeRobotDataset, cache: EpisodeByteCache, url: str, error: type, reason: str) -> None:
    """Episode 2 fails with `error` naming `url` and the episode; episodes 0 and 1 (another file) still decode."""
    prefix = re.escape(f"{url}: episode 2, camera {KEY}: ")
    with pytest.raises(error, match=f"^{prefix}{reason}"):
        cache.read_frames([FrameRequest(2, KEY, frame_numbers=[0])])
    zero, one = cache.read_frames([FrameRequest(0, KEY, frame_numbers=[0, 1]), FrameRequest(1, KEY, frame_numbers=[0])])
    assert read_indices(zero.frames) == [0, 1] and read_indices(one.frames) == [ds.episode(1).dataset_from_index]


def test_truncated_mp4(root: Path, tmp_path: Path) -> None:
    video = root / BROKEN
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        expect_fault(ds, cache, f"{root}/{BROKEN}", Mp4FormatError,
                     r"box 'mdat' at byte \d+ declares \d+ bytes but only \d+ remain \(truncated")


def test_corrupt_sample_tables(root: Path, tmp_path: Path) -> None:
    video = root / BROKEN
    data = video.read_bytes()
    assert data.count(b"stsz") == 1
    video.write_bytes(data.replace(b"stsz", b"xxxx"))
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        expect_fault(ds, cache, f"{root}/{BROKEN}", Mp4FormatError, "video track has neither 'stsz' nor 'stz2' box$")


def test_missing_video_file(root: Path, tmp_path: Path) -> None:
    (root / BROKEN).unlink()
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        expect_fault(ds, cache, f"{root}/{BROKEN}", FetchError, "file not found$")
        cache.prefetch(3)[0].exception(timeout=30)  # a failed prefetch is kept in its future, not raised
        with pytest.raises(FetchError, match=r": episode 3, camera .*: file not found$"):
            cache.fetch_frames([FrameRequest(3, KEY)])


def test_short_read(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
        cache.index_files([BROKEN])
        original = ds.storage.fs.cat_file

        def short(path: str, start: int | None = None, end: int | None = None) -> bytes:
            data = original(path, start=start, end=end)
            return data[:-3] if path.endswith(BROKEN) else data

        monkeypatch.setattr(ds.storage.fs, "cat_file", short)  # fsspec shares one instance: undo after
        expect_fault(ds, cache, f"{root}/{BROKEN}", FetchError, r"read of bytes \[\d+, \d+\) returned \d+ bytes, expected")


class RoutedStorage(Storage):
    """The server's files, except that BROKEN is fetched through one of its fault locations."""

    def __init__(self, root: str, location: str) -> None:
        super().__init__(root, retries=1, backoff_s=0.01, timeout_s=1.0)
        self.location = location

    def path(self, rel: str) -> str:
        return super().path(f"{self.location}/{rel}" if rel == BROKEN else rel)

    def url(self, rel: str) -> str:
        return super().url(f"{self.location}/{rel}" if rel == BROKEN else rel)


@pytest.mark.parametrize("location, reason", [
    # With the sidecar over HTTP no info is asked first: the first range read meets the fault.
    ("fault503", r"read of bytes \[\d+, \d+\) failed after 2 attempts \(HTTP 503"),
    ("slow", r"(info|read of bytes \[\d+, \d+\)) failed after 2 attempts \((no complete answer within the timeout of "
             r"[\d.]+ s|ServerTimeoutError)"),
])
@pytest.mark.nginx
def test_http_errors_are_retried_then_reported(root: Path, tmp_path: Path, location: str, reason: str) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        ds = open_dataset(server.url)
        with EpisodeByteCache(ds, cache_dir=tmp_path / "sidecar") as warm:
            warm.index_files([BROKEN])  # at one byte per second the headers would take minutes; the sidecar has them
        ds.storage = RoutedStorage(server.url, location)
        with EpisodeByteCache(ds, cache_dir=tmp_path / "sidecar") as cache:
            expect_fault(ds, cache, f"{server.url}/{location}/{BROKEN}", FetchError, reason)
            assert server.requests(f"GET /{location}/{BROKEN}") == 2  # one retry, then the error
