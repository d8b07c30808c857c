"""The byte-range path over HTTP from a real nginx: the same frames as from local disk, few requests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from episodes import EpisodeByteCache, FrameRequest, open_dataset, open_video_files
from episodes.__main__ import main
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory

SPEC = SyntheticSpec(codec="h264", gop=6, bframes=2, episodes=5, cameras=2, episodes_per_file=3,
                     min_length=8, max_length=16, width=64, height=64, seed=4)

pytestmark = pytest.mark.nginx


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("remote") / "ds", SPEC)


def test_http_frames_equal_local_frames(root: Path, tmp_path: Path) -> None:
    local_ds = open_dataset(str(root))
    with serve_directory(root, tmp_path / "nginx") as server:
        remote_ds = open_dataset(f"{server.url}/nolist")
        with EpisodeByteCache(remote_ds, cache_dir=tmp_path / "c1") as remote, \
                EpisodeByteCache(local_ds) as local:
            for key in local_ds.video_keys:
                for ep in range(local_ds.num_episodes):
                    every = [FrameRequest(ep, key)]  # every frame of the episode
                    assert torch.equal(remote.read_frames(every)[0].frames, local.read_frames(every)[0].frames), (key, ep)
            stats = remote.stats()
        video_gets = server.requests("GET /nolist/videos/")
        # Per file: a few header probes; per episode-camera: exactly one payload range.
        assert stats.misses == 10 and stats.index_builds == 4
        assert video_gets == stats.header_reads + stats.misses
        assert stats.bytes_fetched < sum(p.stat().st_size for p in root.glob("videos/*/*/*.mp4"))


def test_http_verifier_and_plain_video_urls(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        assert main(["verify", server.url, "--cameras", "observation.images.cam1"]) == 0
        assert capsys.readouterr().out == "5 episode-cameras checked on cpu: 5 identical, 0 different\n"
        url = f"{server.url}/videos/observation.images.cam0/chunk-000/file-001.mp4"
        videos = open_video_files([url])
        assert videos.root == f"{server.url}/videos/observation.images.cam0/chunk-000"
        assert videos.episode_length(0) == sum(open_dataset(str(root)).episode_length(e) for e in (3, 4))
        with EpisodeByteCache(videos, cache_dir=tmp_path / "c2") as cache:
            (read,) = cache.read_frames([FrameRequest(0, "video", frame_numbers=[0, videos.episode_length(0) - 1])])
        local_ds = open_dataset(str(root))
        with EpisodeByteCache(local_ds) as local:
            first, last = local.read_frames([
                FrameRequest(3, "observation.images.cam0", frame_numbers=[0]),
                FrameRequest(4, "observation.images.cam0", frame_numbers=[local_ds.episode_length(4) - 1])])
        frames, expected = read.frames, torch.cat([first.frames, last.frames])
        assert torch.equal(frames, expected)
