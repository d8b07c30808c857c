"""bench/episode_bench.py on tiny datasets: exact byte counts, the cached dataset, ffmpeg's work, the row shapes."""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from bench import access_bench, episode_bench
from bench.common import Effort
from bench.episode_bench import (
    benchmark_cpu_seconds,
    bytes_rows,
    cached_dataset_name,
    ffmpeg_command,
    grainy_dataset,
    remote_rows,
    sidecar_rows,
)
from episodes import EpisodeByteCache, FrameRequest, open_dataset
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory

TINY = SyntheticSpec(codec="h264", gop=6, bframes=2, episodes=14, cameras=1, episodes_per_file=14,
                     min_length=9, max_length=12, width=64, height=64, seed=5)
EFFORT = Effort.of(quick=True)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("bench") / "ds", TINY)


def ffprobe_packet_bytes(path: Path) -> int:
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=size",
                          "-of", "csv=p=0", str(path)], capture_output=True, text=True, check=True).stdout
    return sum(int(line) for line in out.split())


def test_bytes_rows_count_every_episode_and_own_bytes_tile_the_file(root: Path) -> None:
    rows = bytes_rows(root)
    assert [row.id for row in rows] == ["P2", "P2w", "P2m"]
    assert [str(row.goal) for row in rows] == ["<= 1.05", "None", "None"]
    assert {row.reps for row in rows} == {14}
    own = rows[0].b.values
    # Episodes sit back to back, so their own samples are exactly the file's packets.
    assert sum(own) == ffprobe_packet_bytes(next(root.glob("videos/*/*/*.mp4")))
    tight, fetched, mini = (row.a.values for row in rows)
    assert all(o <= t <= f < m for o, t, f, m in zip(own, tight, fetched, mini))


def test_ffmpeg_decodes_every_sample_of_the_mini_mp4(root: Path, tmp_path: Path) -> None:
    with EpisodeByteCache(open_dataset(str(root))) as cache:
        mini = cache.fetch_frames([FrameRequest(3, "observation.images.cam0")])[0].mini
    path = tmp_path / "episode.mp4"
    path.write_bytes(mini.data)
    command = ffmpeg_command(path)
    assert command[-3:] == ["-f", "null", "-"]
    done = subprocess.run(command[:-3] + ["-f", "framecrc", "-"], capture_output=True, text=True, check=True)
    frames = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert len(frames) == len(mini.pts) > mini.num_frames
    assert all(line.split(",")[-1].strip() for line in frames)
    assert f"{64 * 64 * 3}," in frames[0]  # rgb24: 3 bytes per pixel, as torchcodec returns


def test_benchmark_cpu_seconds_reads_utime_and_stime_and_names_a_missing_line() -> None:
    output = "frame=  10\nbench: utime=0.051s stime=0.004s rtime=0.125s\nbench: maxrss=52224kB\n"
    assert benchmark_cpu_seconds(output) == pytest.approx(0.055)
    with pytest.raises(ValueError, match=r"^ffmpeg -benchmark printed no 'bench: utime=\.\.\. stime=\.\.\.' line in: "
                                         r"'oops'$"):
        benchmark_cpu_seconds("oops")


def test_the_cached_dataset_name_follows_the_spec_and_the_grain() -> None:
    name = cached_dataset_name(TINY, 128)
    assert name.startswith("grainy-h264-64x64-14ep-") and len(name) == len("grainy-h264-64x64-14ep-") + 12
    assert cached_dataset_name(TINY, 128) == name
    assert cached_dataset_name(TINY, 64) != name
    assert cached_dataset_name(dataclasses.replace(TINY, seed=6), 128) != name


def test_grainy_dataset_is_generated_once_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(TINY, episodes=3, episodes_per_file=3)
    stale = tmp_path / f"{cached_dataset_name(spec, 128)}.partial"
    stale.mkdir()
    (stale / "left-over").write_text("an interrupted run")
    root = grainy_dataset(tmp_path, spec)
    assert root == tmp_path / cached_dataset_name(spec, 128)
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]
    clean = make_dataset(tmp_path / "clean", spec)
    video = "videos/observation.images.cam0/chunk-000/file-000.mp4"
    assert (root / video).stat().st_size > 2 * (clean / video).stat().st_size
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds) as cache:
        (read,) = cache.read_frames([FrameRequest(2, "observation.images.cam0")])
    frames = read.frames
    assert frames.shape == (ds.episode_length(2), 3, 64, 64)

    def regenerate(*args: object) -> Path:
        raise AssertionError("a finished dataset was generated again")
    monkeypatch.setattr(episode_bench, "make_grainy_dataset", regenerate)
    assert grainy_dataset(tmp_path, spec) == root


@pytest.mark.nginx
def test_remote_and_sidecar_rows_over_nginx(root: Path, tmp_path: Path) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        remote = remote_rows(server, root, tmp_path, EFFORT)
        sidecar = sidecar_rows(server.url, tmp_path, EFFORT)
    assert [row.id for row in remote] == ["P3", "P3h", "P3a"]
    assert [row.goal for row in remote] == [None, None, None]  # on loopback the ratio is the file's size
    assert "all 11 frames" in remote[2].what  # episode 12 of TINY has 11 frames
    for row in remote + sidecar[1:]:
        assert row.reps == 5 and len(row.a.values) == len(row.b.values) == 5
        assert row.low <= row.ratio <= row.high
    p7 = sidecar[0]
    assert (p7.id, p7.ratio, p7.met, p7.a.values) == ("P7", 0.0, True, (0,))
    assert p7.b.values[0] > 0 and "0 header reads on the second run" in p7.note


@pytest.mark.nginx
@pytest.mark.slow
def test_p3_through_both_network_profiles_keeps_its_goals(root: Path, tmp_path: Path) -> None:
    (wan,) = access_bench.access_rows("P3n", EFFORT, tmp_path, tmp_path, lambda: root)
    (slow,) = access_bench.access_rows("P3s", EFFORT, tmp_path, tmp_path, lambda: root)
    assert (wan.id, str(wan.goal), slow.id, str(slow.goal)) == ("P3n", ">= 10", "P3s", ">= 20")
    assert "100 Mbit/s, 20 ms RTT" in wan.what and "20 Mbit/s, 80 ms RTT" in slow.what
    assert slow.reps == 5 and slow.ratio > 0
