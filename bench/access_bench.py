"""Episode access beyond whole episodes: rows P2r, P3r, P10, P10n, P3n, P3s, P4r, P10r and P11 of bench/run.py.

The datasets mimic LeRobot v3.0 files of many episodes: 64 episodes of
220-300 frames, 16 to a file, 128x128 frames with random grain so they weigh
what camera frames do, and the same frames encoded twice: H.264 with a
keyframe every 30 frames and B-frames (the codec P3 uses) and AV1 with a
keyframe every 2 frames (LeRobot's default). Both are generated once under
the benchmark cache directory (a few minutes) and reused.

P4r and P10r read 480x640 copies (the camera resolution of many LeRobot
datasets): 12 episodes, 4 to a file, H.264 at GOP 30 and AV1 at GOP 2, about
six minutes to generate here the first time; --quick makes 8 (about four
minutes).

Random frames (P2r, P3r) are drawn as LeRobot's random-frames track draws
them (episodes.tools.streaming.random_targets). Remote rows go through the test
server's network profiles (episodes.testing.network.WAN: 100 Mbit/s, 20 ms
round trip; SLOW_WAN, for P3s: 20 Mbit/s, 80 ms). Timed rows are medians of
paired, alternating repetitions (bench.common.paired); before timing, both
sides must return identical frames (or values).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import psutil
import torch

from bench.common import Effort, Goal, Row, Side, compare, measure_pair
from bench.episode_bench import SPEED_GOAL, decode_rows, frame_size, grainy_dataset, remote_rows
from episodes import LeRobotDataset, open_dataset
from episodes.synthetic import SyntheticSpec
from episodes.testing.network import SLOW_WAN, WAN, NetworkProfile
from episodes.testing.server import serve_directory
from episodes.tools.spans import episode_bytes
from episodes.tools.streaming import (
    StreamingOptions,
    Targets,
    TrackResult,
    random_targets,
    remote_decoder_track,
    windows_track,
)
from models.episode import EpisodeLoader
from models.episode_reader import cache_dir
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard

GOP30 = SyntheticSpec(codec="h264", gop=30, bframes=2, episodes=64, cameras=1, episodes_per_file=16,
                      min_length=220, max_length=300, width=128, height=128, seed=13)
GOP2 = dataclasses.replace(GOP30, codec="av1", gop=2, bframes=0)
# P4r, P10r, P10d: 480x640, the camera resolution of many LeRobot datasets. Four episodes to a file keep
# the generator's frames in memory near 1 GB; more episodes than a row has items, so none is read twice.
VGA30 = dataclasses.replace(GOP30, episodes=12, episodes_per_file=4, width=640, height=480, seed=17)
VGA2 = dataclasses.replace(VGA30, codec="av1", gop=2, bframes=0)
QUICK_VGA_EPISODES = 8
# The bench's grain (128) would make 480x640 frames of 90 kB in H.264 (21 Mbit/s at 30 fps), several times
# what a camera stream weighs, and decoding as many times dearer; at 28 they weigh 18 kB (4.4 Mbit/s) in
# H.264 and 11 kB in AV1. Below about 24 the encoder quantises the grain away.
VGA_GRAIN = 28
TARGETS = 4096  # P2r: random frames over the 64 episodes, as the figure asks
COLUMNS = ["observation.state", "action"]


def datasets(cache_dir: Path) -> dict[int, Path]:
    """{keyframe interval: dataset root}, generated on first use."""
    return {30: grainy_dataset(cache_dir, GOP30), 2: grainy_dataset(cache_dir, GOP2)}


def vga_datasets(cache_dir: Path, effort: Effort) -> dict[int, Path]:
    """{keyframe interval: 480x640 dataset root}, generated on first use (--quick: fewer episodes)."""
    specs = {30: VGA30, 2: VGA2}
    if effort.quick:
        specs = {gop: dataclasses.replace(spec, episodes=QUICK_VGA_EPISODES) for gop, spec in specs.items()}
    return {gop: grainy_dataset(cache_dir, spec, VGA_GRAIN) for gop, spec in specs.items()}


def _options(targets: int, *, include_decode: bool = False, cache_dir: str | None = None) -> StreamingOptions:
    return StreamingOptions(frame_pool_size=targets, include_decode=include_decode, cache_dir=cache_dir)


def random_targets_of(ds: LeRobotDataset, count: int, *, include_decode: bool = False,
                      cache_dir: str | None = None) -> tuple[Targets, StreamingOptions]:
    """`count` random frames drawn as LeRobot's random-frames track draws them, and the options that drew them."""
    options = _options(count, include_decode=include_decode, cache_dir=cache_dir)
    return random_targets(ds, options), options


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


def _timed_track(run: Callable[[], tuple[TrackResult, str]]) -> Callable[[], float]:
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
            targets, options = random_targets_of(ds, count, include_decode=True, cache_dir=str(workdir / "sidecar-wan"))
            theirs = lambda: remote_decoder_track(ds, targets)  # noqa: E731
            ours = lambda: windows_track(ds, targets, options)  # noqa: E731
            if ours()[1] != theirs()[1]:
                raise AssertionError(f"GOP {gop}: frame windows and the remote decoder decode different frames")
            note = (f"{count} random frames over {len(targets)} episodes (GOP {gop}) through {WAN}; both decode, "
                    "frames checked identical; windows at LeRobot's 256 KiB gap, indexes from the sidecar")
            rows.append(measure_pair(id, f"s for random frames over HTTP ({WAN}): remote decoder / windows, GOP {gop}",
                                     None, ("remote decoder", "s", _timed_track(theirs)),
                                     ("windows", "s", _timed_track(ours)), effort.reps, warmup=0, note=note))
    return rows


# ---- P10: the R(2+1)D loader, clips / whole episodes ------------------------------------


@dataclass(frozen=True)
class LoaderSetup:
    """How a row's EpisodeLoader reads: fetch mode, requests prefetched ahead, fetch and decode threads, coalescing.

    Threads None are the loader's default (torch's threads); `coalesce_gap` 0 reads only the clips' windows;
    `byte_budget` bounds what its cache holds (kept episodes and bytes in flight); `device` is where it decodes.
    """

    fetch: Literal["episode", "clips"]
    prefetch: int = 2
    workers: int | None = None
    decode_threads: int | None = None
    coalesce_gap: int = 0
    byte_budget: int = 2**30
    device: str = "cpu"

    def loader(self, seed: int) -> EpisodeLoader:
        return EpisodeLoader(torch.device(self.device), fetch=self.fetch, num_clips=10, clip_length=8, size=112, seed=seed,
                             prefetch=self.prefetch, workers=self.workers, decode_threads=self.decode_threads,
                             coalesce_gap=self.coalesce_gap, byte_budget=self.byte_budget)


def item_requests(root: str, start: int, count: int) -> list[EpisodeRequest]:
    """The requests of items 0..count-1: episodes in an order drawn with `start`, each naming the next two."""
    episodes = open_dataset(root).num_episodes
    order = np.random.default_rng(start).permutation(episodes).tolist() * (count // episodes + 3)
    return [EpisodeRequest("dataset", root, order[i], tuple(order[i + 1 : i + 3])) for i in range(count)]


def loader_rate(root: str, setup: LoaderSetup, items: int, start: int, cards: list[TimeCard],
                cpu: list[float] | None = None) -> float:
    """items/s of a fresh loader seeded `start` over `items` requests (after one untimed warm-up item); their cards,
    and, into `cpu`, the machine's CPU seconds per timed item that this process and its children spent."""
    loader = setup.loader(start)
    requests = item_requests(root, start, items + 1)

    def item(i: int) -> TimeCard:
        card = TimeCard(i)
        loader((), {"request": requests[i]}, card)  # the loader stamps the card it was given
        return card

    item(0)
    spent = family_cpu_s()
    started = time.perf_counter()
    done = [item(i) for i in range(1, items + 1)]
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.append((family_cpu_s() - spent) / items)
    cards.extend(done)
    return items / elapsed


def family_cpu_s() -> float:
    """CPU seconds, user and system, of this process and of the children it runs now (a test server, its relay)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that has exited since the listing
            total += sum(child.cpu_times()[:2])
    return total


def _item_bytes(cards: Sequence[TimeCard], items: int) -> list[int]:
    """Source bytes per item, one figure per repetition of `items` cards."""
    used = [int(card.fields["bytes_fetched"]) + int(card.fields["bytes_reused"]) for card in cards]
    return [sum(used[i : i + items]) // items for i in range(0, len(used), items)]


def _loader_pair(id: str, what: str, goal: Goal | None, root: str, clips: LoaderSetup, episode: LoaderSetup,
                 items: int, effort: Effort, note: str) -> tuple[Row, Row, list[TimeCard], list[TimeCard]]:
    """The clips / episode items/s row, the bytes row beside it (`id`b), and both sides' time cards."""
    starts = iter(range(1000))
    clip_cards: list[TimeCard] = []
    episode_cards: list[TimeCard] = []
    row = measure_pair(id, what, goal,
                       ("clips", "items/s", lambda: loader_rate(root, clips, items, next(starts), clip_cards)),
                       ("episode", "items/s", lambda: loader_rate(root, episode, items, next(starts), episode_cards)),
                       effort.reps, note=note)
    # The warm-up pair's cards are the first `items` of each side; the bytes row counts them too.
    bytes_row = compare(f"{id}b", f"source bytes an item needs, clips / episode ({what.rsplit(', ', 1)[-1]})", None,
                        Side.of("clips", "bytes", _item_bytes(clip_cards, items)),
                        Side.of("episode", "bytes", _item_bytes(episode_cards, items)))
    return row, bytes_row, clip_cards, episode_cards


def loader_rows(roots: dict[int, Path], effort: Effort, cases: Sequence[tuple[int, str]] = ((2, "P10"), (30, "P10g30")),
                items: tuple[int, int] = (6, 16)) -> list[Row]:
    """Loader items/s with fetch "clips" / "episode" from local disk for each (keyframe interval, id), with bytes."""
    count = effort.pick(*items)
    rows = []
    for gop, id in cases:
        root = roots[gop]
        note = (f"{count} items per repetition, 10 clips of 8 frames resized to 112, in-process on the CPU from local "
                f"disk, {resolution(root)}; keyframe every {gop} frames; clips read with coalesce gap 0, episodes "
                "prefetched 2 ahead")
        row, bytes_row, _, _ = _loader_pair(id, f"R(2+1)D loader items/s, fetch clips / episode, {resolution(root)}, "
                                            f"GOP {gop}", None, str(root), LoaderSetup("clips"), LoaderSetup("episode"),
                                            count, effort, note)
        rows += [row, bytes_row]
    return rows


def resolution(root: Path) -> str:
    """'HxW' of the dataset's first camera."""
    ds = open_dataset(str(root))
    height, width = frame_size(ds, ds.video_keys[0])
    return f"{height}x{width}"


def waited_ms(cards: Sequence[TimeCard]) -> float:
    """Median ms an item waited for its first bytes: its own fetch, or a prefetch's wait (models.episode)."""
    def span(card: TimeCard) -> float:
        name = "prefetch_wait" if "prefetch_wait_start" in card.events else "fetch"
        return card.events[f"{name}_finish"] - card.events[f"{name}_start"]
    return 1000 * float(np.median([span(card) for card in cards]))


def decoding_ms(cards: Sequence[TimeCard]) -> float:
    """Median ms an item spent decoding (waits for its later bytes included)."""
    return 1000 * float(np.median([card.events["decode_finish"] - card.events["decode_start"] for card in cards]))


# P10n, P3w, P3m: clips of GOP 2 through the link, 8 fetch threads, only the clips' windows read (gap 0).
WAN_CLIPS = LoaderSetup("clips", workers=8, coalesce_gap=0)


def network_loader_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P10 through the network profile: clips fetched ahead while items decode / whole episodes, nothing prefetched.

    Where fetching is the cost, fetching less and ahead must show: an
    episode's fetch is as long as its decode, while the clips' fetch is a
    third of it and runs while the item before decodes.
    """
    count = effort.pick(6, 16)
    with serve_directory(root, workdir / "nginx-p10n", profile=WAN) as server:
        episode = LoaderSetup("episode", prefetch=0, workers=8)
        row, bytes_row, clip_cards, episode_cards = _loader_pair(
            "P10n", f"R(2+1)D loader items/s, clips fetched ahead / episodes, nothing prefetched, through {WAN}, GOP 2",
            Goal(">=", 1.85), server.url, WAN_CLIPS, episode, count, effort, "")
    # What bounds the ratio: each side's item is its wait for bytes plus the rest (decode, resize, bookkeeping).
    wait = {"clips": waited_ms(clip_cards), "episode": waited_ms(episode_cards)}
    assert row.a is not None and row.b is not None  # measure_pair always measures both sides
    item_ms = {"clips": 1000 / row.a.median, "episode": 1000 / row.b.median}
    rest = {side: item_ms[side] - wait[side] for side in item_ms}
    note = (f"{count} items per repetition, 10 clips of 8 frames resized to 112, {resolution(root)}, keyframe every 2 "
            f"frames, 8 fetch threads, clips at coalesce gap 0 and fetched 2 items ahead, episodes not prefetched. "
            f"Per item (median): clips wait {wait['clips']:.0f} ms for their first bytes and spend {rest['clips']:.0f} "
            f"ms on the rest, episodes {wait['episode']:.0f} and {rest['episode']:.0f} ms; with the clips' wait at 0 "
            f"the ratio would be {item_ms['episode'] / rest['clips']:.2f}")
    return [dataclasses.replace(row, note=note), bytes_row]


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


def wan_p3_rows(root: Path, workdir: Path, effort: Effort, profile: NetworkProfile = WAN, suffix: str = "n",
                goal: Goal = SPEED_GOAL) -> list[Row]:
    """P3 (an episode's first clip: full remote file / byte range) through a network profile."""
    with serve_directory(root, workdir / f"nginx-p3{suffix}", profile=profile) as server:
        return remote_rows(server, root, workdir / f"p3{suffix}", effort, link=f"nginx through {profile}",
                           only=("P3",), suffix=suffix, goals={"P3": goal})


# ---- P4r, P10r: 480x640 ----------------------------------------------------------------------

P4R_EPISODE = 5  # in the middle of the second file, at --quick and full size alike


def vga_rows(name: str, effort: Effort, cache_dir: Path, workdir: Path) -> list[Row]:
    """P4 (decode frames/s against ffmpeg) and P10 (clips / episode at GOP 2) at 480x640."""
    roots = vga_datasets(cache_dir, effort)
    if name == "P4r":
        return decode_rows(roots[30], workdir, effort, episode=P4R_EPISODE, id="P4r")
    return loader_rows(roots, effort, cases=((2, "P10r"),), items=(6, 10))


def access_rows(name: str, effort: Effort, cache_dir: Path, workdir: Path, p3_dataset: Callable[[], Path]) -> list[Row]:
    """The rows of benchmark `name` (P2r, P3r, P10, P10n, P3n, P3s, P4r, P10r or P11); datasets live under `cache_dir`."""
    if name == "P3n":
        return wan_p3_rows(p3_dataset(), workdir, effort)
    if name == "P3s":
        return wan_p3_rows(p3_dataset(), workdir, effort, SLOW_WAN, "s", Goal(">=", 20))
    if name in ("P4r", "P10r"):
        return vga_rows(name, effort, cache_dir, workdir)
    roots = datasets(cache_dir)
    if name == "P10n":
        return network_loader_rows(roots[2], workdir, effort)
    if name == "P2r":
        return random_frame_bytes_rows(roots, workdir)
    if name == "P3r":
        return remote_random_rows(roots, workdir, effort)
    if name == "P10":
        return loader_rows(roots, effort)
    if name == "P11":
        return tabular_rows(roots, effort)
    raise ValueError(f"bench/access_bench.py has no benchmark {name!r}")
