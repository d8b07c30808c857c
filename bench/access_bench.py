"""Episode access beyond whole episodes: rows P2r, P3r, P10, P3n and P11 of bench/run.py.

The datasets mimic LeRobot v3.0 files of many episodes: 64 episodes of
220-300 frames, 16 to a file, 128x128 frames with random grain so they weigh
what camera frames do, and the same frames encoded twice: H.264 with a
keyframe every 30 frames and B-frames (the codec P3 uses) and AV1 with a
keyframe every 2 frames (LeRobot's default). Both are generated once under
the benchmark cache directory (a few minutes) and reused.

Random frames (P2r, P3r) are drawn as LeRobot's random-frames track draws
them (episodes.tools.streaming.random_targets). Remote rows go through the test
server's network profile (episodes.testing.network.WAN: 100 Mbit/s, 20 ms
round trip). Timed rows are medians of paired, alternating repetitions
(bench.common.paired); before timing, both sides must return identical
frames (or values).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common import Effort, Goal, Row, Side, compare, measure_pair
from bench.episode_bench import grainy_dataset, remote_rows
from episodes import LeRobotDataset, open_dataset
from episodes.testing.network import WAN
from episodes.testing.server import serve_directory
from episodes.testing.synthetic import SyntheticSpec
from episodes.tools.spans import episode_bytes
from episodes.tools.streaming import StreamingOptions, random_targets, remote_decoder_track, windows_track
from models.episode import EpisodeLoader, cache_dir
from rnb.core.timecard import TimeCard
from rnb.pipeline.dataset_source import EpisodeRequest

GOP30 = SyntheticSpec(codec="h264", gop=30, bframes=2, episodes=64, cameras=1, episodes_per_file=16,
                      min_length=220, max_length=300, width=128, height=128, seed=13)
GOP2 = dataclasses.replace(GOP30, codec="av1", gop=2, bframes=0)
TARGETS = 4096  # P2r: random frames over the 64 episodes, as the figure asks
COLUMNS = ["observation.state", "action"]


def datasets(cache_dir: Path) -> dict[int, Path]:
    """{keyframe interval: dataset root}, generated on first use."""
    return {30: grainy_dataset(cache_dir, GOP30), 2: grainy_dataset(cache_dir, GOP2)}


def _options(targets: int, **changes: object) -> StreamingOptions:
    return StreamingOptions(frame_pool_size=targets, **changes)


# ---- P2r: bytes of random frames ------------------------------------------------


def _whole_episode_bytes(ds: LeRobotDataset, episodes: set[int]) -> int:
    """What fetching each touched episode whole would read: the sum of their byte ranges."""
    return sum(b.widened for b in episode_bytes(ds, sorted(episodes), ds.video_keys[0]))


def random_frame_bytes_rows(roots: dict[int, Path], workdir: Path) -> list[Row]:
    """Bytes fetched for 4,096 random frames over their useful sample bytes (exact counts, no timing)."""
    rows = []
    for gop, id in ((30, "P2r"), (2, "P2r2")):
        ds = open_dataset(str(roots[gop]))
        options = _options(TARGETS, cache_dir=str(workdir / "sidecar"))
        targets = random_targets(ds, options)
        row, _ = windows_track(ds, targets, options)
        useful = Side("useful", "bytes", row.bytes_useful, (row.bytes_useful,))
        whole = _whole_episode_bytes(ds, {ep for ep, _ in targets})
        note = (f"{TARGETS} frames over {len(targets)} of {ds.num_episodes} episodes, keyframe every {gop} frames; "
                f"{row.ranges_before} runs -> {row.ranges_after} range requests at LeRobot's 256 KiB gap")
        rows.append(compare(id, f"bytes fetched for random frames / their useful sample bytes, GOP {gop}",
                            Goal("<=", 1.2) if gop == 30 else None,
                            Side("fetched", "bytes", row.bytes_fetched, (row.bytes_fetched,)), useful, note))
        rows.append(compare(f"{id}e", f"the same fetched as whole episodes / useful bytes, GOP {gop}", None,
                            Side("whole episodes", "bytes", whole, (whole,)), useful))
    return rows


# ---- P3r: random frames over the network profile ------------------------------------


def _timed_track(run: Callable[[], tuple[object, str]]) -> Callable[[], float]:
    def measure() -> float:
        row, _ = run()
        return row.index_s + row.wall_s  # the remote decoder's index is its moov read, ours the sidecar
    return measure


def remote_random_rows(roots: dict[int, Path], workdir: Path, effort: Effort) -> list[Row]:
    """Seconds to decode random frames over the network profile: torchcodec on the remote file / frame windows."""
    count = effort.pick(64, 128)
    rows = []
    for gop, id in ((30, "P3r"), (2, "P3r2"))[: effort.pick(1, 2)]:
        with serve_directory(roots[gop], workdir / f"nginx-p3r{gop}", profile=WAN) as server:
            ds = open_dataset(server.url)
            options = _options(count, include_decode=True, cache_dir=str(workdir / "sidecar-wan"))
            targets = random_targets(ds, options)
            theirs = lambda: remote_decoder_track(ds, targets)  # noqa: E731
            ours = lambda: windows_track(ds, targets, options)  # noqa: E731
            if ours()[1] != theirs()[1]:
                raise AssertionError(f"GOP {gop}: frame windows and the remote decoder decode different frames")
            note = (f"{count} random frames over {len(targets)} episodes (GOP {gop}) through {WAN}; both decode, "
                    "frames checked identical; windows at LeRobot's 256 KiB gap, indexes from the sidecar")
            rows.append(measure_pair(id, f"s for random frames over HTTP ({WAN}): remote decoder / windows, GOP {gop}",
                                     Goal(">=", 50) if gop == 30 else None, ("remote decoder", "s", _timed_track(theirs)),
                                     ("windows", "s", _timed_track(ours)), effort.reps, warmup=0, note=note))
    return rows


# ---- P10: the R(2+1)D loader, clips / whole episodes ------------------------------------


def _loader_rate(root: Path, fetch: str, items: int, start: int, bytes_seen: list[int]) -> float:
    """items/s of a fresh EpisodeLoader over `items` requests (after one untimed warm-up item)."""
    order = np.random.default_rng(start).permutation(open_dataset(str(root)).num_episodes).tolist() * 3
    loader = EpisodeLoader(torch.device("cpu"), fetch=fetch, num_clips=10, clip_length=8, size=112, seed=start,
                           coalesce_gap=0)

    def item(i: int) -> TimeCard:
        request = EpisodeRequest("dataset", str(root), order[i], tuple(order[i + 1 : i + 3]))
        return loader((), {"request": request}, TimeCard(i))[2]

    item(0)
    started = time.perf_counter()
    cards = [item(i) for i in range(1, items + 1)]
    elapsed = time.perf_counter() - started
    bytes_seen.append(sum(card.fields["bytes_fetched"] + card.fields["bytes_reused"] for card in cards) // items)
    return items / elapsed


def loader_rows(roots: dict[int, Path], effort: Effort) -> list[Row]:
    """Loader items/s with fetch "clips" / "episode" at GOP 2 and GOP 30, and the bytes each item needs."""
    items = effort.pick(6, 16)
    rows = []
    for gop, id in ((2, "P10"), (30, "P10g30")):
        starts = iter(range(1000))
        clip_bytes: list[int] = []
        episode_bytes: list[int] = []
        note = (f"{items} items per repetition, 10 clips of 8 frames resized to 112, in-process on the CPU from local "
                f"disk; keyframe every {gop} frames; clips read with coalesce gap 0, episodes prefetched 2 ahead")
        rows.append(measure_pair(id, f"R(2+1)D loader items/s, fetch clips / episode, GOP {gop}",
                                 Goal(">=", 2) if gop == 2 else None,
                                 ("clips", "items/s", lambda: _loader_rate(roots[gop], "clips", items, next(starts),
                                                                           clip_bytes)),
                                 ("episode", "items/s", lambda: _loader_rate(roots[gop], "episode", items,
                                                                             next(starts), episode_bytes)),
                                 effort.reps, note=note))
        rows.append(compare(f"{id}b", f"source bytes an item needs, clips / episode, GOP {gop}", None,
                            Side.of("clips", "bytes", clip_bytes), Side.of("episode", "bytes", episode_bytes)))
    return rows


# ---- P11: tabular rows, Parquet / usage format -------------------------------------------


def tabular_rows(roots: dict[int, Path], effort: Effort) -> list[Row]:
    """Milliseconds per episode to read state and action: Parquet row groups / the memmapped usage-format copy."""
    root = str(roots[30])
    parquet, usage = open_dataset(root), open_dataset(root, usage_cache_dir=cache_dir())
    episodes = range(parquet.num_episodes)
    for ep in episodes:
        a, b = parquet.episode_columns(ep, COLUMNS), usage.episode_columns(ep, COLUMNS)
        if any(not np.array_equal(a[c], b[c]) or a[c].dtype != b[c].dtype for c in COLUMNS):
            raise AssertionError(f"episode {ep}: the usage-format copy differs from the Parquet rows")

    def per_episode(ds: LeRobotDataset) -> Callable[[], float]:
        def measure() -> float:
            started = time.perf_counter()
            for ep in episodes:
                ds.episode_columns(ep, COLUMNS)
            return 1000 * (time.perf_counter() - started) / len(episodes)
        return measure

    note = (f"{len(episodes)} episodes of {', '.join(COLUMNS)} (float32 x 6) from local disk, values checked "
            "identical; the usage copy was made by an earlier read")
    return [measure_pair("P11", "ms per episode's tabular rows: Parquet row groups / usage-format memmap",
                         Goal(">=", 50), ("Parquet", "ms", per_episode(parquet)), ("usage", "ms", per_episode(usage)),
                         effort.reps, note=note)]


# ---- P3n: P3 through the network profile ---------------------------------------------------


def wan_p3_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P3 (an episode's first clip: full remote file / byte range) through the network profile."""
    with serve_directory(root, workdir / "nginx-p3n", profile=WAN) as server:
        return remote_rows(server, root, workdir / "p3n", effort, link=f"nginx through {WAN}", only=("P3",),
                           suffix="n")


def access_rows(name: str, effort: Effort, cache_dir: Path, workdir: Path, p3_dataset: Callable[[], Path]) -> list[Row]:
    """The rows of benchmark `name` (P2r, P3r, P10, P3n or P11); datasets live under `cache_dir`."""
    if name == "P3n":
        return wan_p3_rows(p3_dataset(), workdir, effort)
    roots = datasets(cache_dir)
    if name == "P2r":
        return random_frame_bytes_rows(roots, workdir)
    if name == "P3r":
        return remote_random_rows(roots, workdir, effort)
    if name == "P10":
        return loader_rows(roots, effort)
    if name == "P11":
        return tabular_rows(roots, effort)
    raise ValueError(f"bench/access_bench.py has no benchmark {name!r}")
