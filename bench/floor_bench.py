"""The data path against what decoding alone costs: rows P3rd and P10d of bench/run.py.

P3r (remote decoder / frame windows) and P10 (clips / whole episodes)
compare two ways of reading, and both sides of each decode the same frames,
so their ratios say which way is cheaper, not how much is left of either once
decoding is paid. These rows put the data path next to its floor: exactly the
same frames decoded from bytes already in memory. As MLPerf LoadGen's
performance mode loads its samples into memory before the timed run, the
floor reads each source file whole into memory before timing and opens one
torchcodec decoder over it (exact mode, one FFmpeg thread); as torchcodec's
own benchmarks do, only the `get_frames_at` calls (and, for P10d, the same
resize and normalisation the loader does) are timed. Decoder creation is
outside too, so the floor is decoding alone and a ratio of 1 is out of reach
by whatever a reader must do besides: index, fetch, wrap a mini-MP4, open a
decoder per read. Before timing, both sides must give identical frames
(P3rd) or clips (P10d).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from bench.access_bench import (
    LoaderSetup,
    decoding_ms,
    item_requests,
    loader_rate,
    random_targets_of,
    resolution,
    waited_ms,
)
from bench.common import Effort, Goal, Row, measure_pair
from episodes import EpisodeByteCache, EpisodeDataset, FrameRequest, open_dataset
from episodes.testing.network import WAN
from episodes.testing.server import serve_directory
from episodes.tools.streaming import TrackResult, windows_track
from episodes.tools.verify import FullFileReference
from models.episode_decode import decode_clips
from models.episode_reader import ClipPlan, EpisodeReader
from rnb.core.timecard import TimeCard

CLIPS, CLIP_LENGTH, SIZE = 10, 8, 112  # P10d: the R(2+1)D loader's defaults


@dataclass(frozen=True)
class FloorRead:
    """What the floor decodes for one read: frames of one source file, by position in presentation order."""

    path: str
    positions: tuple[int, ...]


class InMemoryFloor:
    """torchcodec over whole source files held in memory, one decoder per file opened before anything is timed."""

    def __init__(self, ds: EpisodeDataset, key: str) -> None:
        self.ds, self.key = ds, key
        paths = sorted({ds.episode(ep).videos[key].path for ep in range(ds.num_episodes)})
        storage = ds.storage
        self._decoders = {rel: VideoDecoder(storage.fs.cat_file(storage.path(rel)), seek_mode="exact",
                                            num_ffmpeg_threads=1) for rel in paths}
        # Where each episode's frame 0 sits in its file, as the full-file check finds it (files visited in order).
        reference = FullFileReference(ds)
        try:
            by_file = sorted(range(ds.num_episodes), key=lambda ep: ds.episode(ep).videos[key].path)
            self._first = {ep: reference.global_indices(ep, key, [0])[0] for ep in by_file}
        finally:
            reference.close()

    def read(self, ep: int, frame_numbers: Iterable[int]) -> FloorRead:
        return FloorRead(self.ds.episode(ep).videos[self.key].path,
                         tuple(self._first[ep] + int(n) for n in frame_numbers))

    def frames(self, read: FloorRead) -> torch.Tensor:
        """uint8 (N, C, H, W) frames of one read."""
        return self._decoders[read.path].get_frames_at(list(read.positions)).data


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` for the block (resizing and normalising run on them)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- P3rd: random frames over the network, frame windows / the decoding floor -----------------------


# P3rd's coalescing gap: what a range request costs this link in bytes, its bandwidth times its round trip shared
# by the 8 requests in flight (12.5 MB/s x 20 ms / 8, about 31 KB); LeRobot's 256 KiB suits a slower, farther link.
P3RD_GAP_KB = 32
# Repetitions of P3rd under --quick: a pair takes about a second, and a busy neighbour moves one pair's ratio by a
# tenth or more, so the median is taken over more pairs than MIN_REPS.
P3RD_QUICK_REPS = 9


def windows_floor_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """Seconds for random frames: frame windows through the network profile / decoding them from memory."""
    count = effort.pick(64, 128)
    local = open_dataset(str(root))
    floor = InMemoryFloor(local, local.video_keys[0])
    with serve_directory(root, workdir / "nginx-p3rd", profile=WAN) as server:
        ds = open_dataset(server.url)
        targets, options = random_targets_of(ds, count, include_decode=True, cache_dir=str(workdir / "sidecar-p3rd"))
        options = dataclasses.replace(options, coalesce_gap_kb=P3RD_GAP_KB)
        reads = [floor.read(ep, np.rint(stamps * ds.fps).astype(np.int64)) for (ep, _), stamps in targets.items()]
        with EpisodeByteCache(local) as cache:
            got = cache.read_frames([FrameRequest(ep, key, timestamps=stamps) for (ep, key), stamps in targets.items()],
                                    fetch="windows", coalesce_gap=P3RD_GAP_KB * 1024)
        if not all(torch.equal(floor.frames(read), g.frames) for read, g in zip(reads, got)):
            raise AssertionError("frame windows and the in-memory decode give different frames")
        windows_track(ds, targets, options)  # writes the sidecar the timed runs index from
        seen: list[TrackResult] = []
        cpu: dict[str, list[float]] = {"reader": [], "helpers": [], "floor": []}
        each_read_s: list[list[float]] = []   # per repetition, the floor's seconds for each request

        def windows() -> float:
            thread, process = time.thread_time(), time.process_time()
            row, _ = windows_track(ds, targets, options)
            cpu["reader"].append(time.thread_time() - thread)
            cpu["helpers"].append(time.process_time() - process - cpu["reader"][-1])
            seen.append(row)
            return row.index_s + row.wall_s

        def in_memory() -> float:
            started, thread = time.perf_counter(), time.thread_time()
            times, last = [], started
            for read in reads:
                floor.frames(read)
                times.append(time.perf_counter() - last)
                last += times[-1]
            each_read_s.append(times)
            cpu["floor"].append(time.thread_time() - thread)
            return time.perf_counter() - started

        row = measure_pair("P3rd", f"s for random frames: frame windows over HTTP ({WAN}) / decoding them from memory "
                           "(the floor), GOP 30", Goal("<=", 1.1), ("windows", "s", windows),
                           ("in memory", "s", in_memory), effort.pick(P3RD_QUICK_REPS, effort.reps), warmup=0)
    assert row.b is not None  # measure_pair always measures both sides
    decode_s = [float(s) for s in np.median(np.array(each_read_s), axis=0)]
    link_s = [g.bytes_fetched / WAN.bytes_per_s for g in got]
    bound = in_order_bound_s(WAN.rtt_ms / 1000, link_s, decode_s) / sum(decode_s)
    return [dataclasses.replace(row, note=_windows_note(count, len(targets), seen, cpu, row.b.median, bound))]


def in_order_bound_s(rtt_s: float, link_s: Sequence[float], decode_s: Sequence[float]) -> float:
    """The least time to read requests whose bytes cross one link in order and each decode once its bytes are in.

    Request k's bytes take link_s[k] of the link after those before it, the
    first a round trip after the start; its decode takes decode_s[k] once
    they are in and the decode of k - 1 is done (a flow shop of two
    stages).  Nothing else costs anything: no index, planning, cutting or
    decoder to open.
    """
    arrived, decoded = rtt_s, 0.0
    for link, decode in zip(link_s, decode_s):
        arrived += link
        decoded = max(decoded, arrived) + decode
    return decoded


def _windows_note(count: int, episodes: int, seen: list[TrackResult], cpu: dict[str, list[float]],
                  floor_median_s: float, in_order_bound: float) -> str:
    """P3rd's note: where the windows' time goes, and the link's own bound for their bytes against the floor."""
    decode_s = float(np.median([r.stage_ms["decode"] * r.jobs / 1000 for r in seen]))
    wall_s = float(np.median([r.index_s + r.wall_s for r in seen]))
    index_s = float(np.median([r.index_s for r in seen]))
    # The link's own floor for those bytes: one round trip, then the bytes at its rate.
    rtt_s = WAN.rtt_ms / 1000
    link_s = rtt_s + seen[-1].bytes_fetched / WAN.bytes_per_s
    reader_s, helpers_s, floor_s = (float(np.median(cpu[name])) for name in ("reader", "helpers", "floor"))
    return (f"{count} random frames over {episodes} episodes; windows at a {P3RD_GAP_KB} KiB gap (a request's "
            f"cost on this link), {seen[-1].ranges_after} range requests, {seen[-1].bytes_fetched / 1e6:.3g} MB, "
            f"indexes from the sidecar; the floor: one decoder per source file in memory, one thread; frames checked "
            f"identical. Windows spends {decode_s:.2f} of its {wall_s:.2f} s decoding (summed over threads, each request "
            f"as soon as its ranges are in, the decoders' opening included), {index_s:.3f} s loading the sidecar's "
            f"indexes (checked by the first range answers), the rest planning, waiting and cutting mini-MP4s. The "
            f"link alone needs {link_s:.2f} s for those bytes: fetching then decoding is bound to "
            f"{(link_s + floor_median_s) / floor_median_s:.2f}x the floor, the link alone to "
            f"{link_s / floor_median_s:.3f}x, and each request decoded in order once its bytes are in (the bytes in "
            f"request order, the floor's own time for each request, nothing else) to {in_order_bound:.3f}x. CPU "
            f"(medians): the reader's thread {reader_s:.3f} s against the floor's "
            f"{floor_s:.3f} s, the fetch threads and the HTTP client {helpers_s:.3f} s more (cutting mini-MP4s, "
            "opening a decoder per request), which needs the second core")


# ---- P10d: the R(2+1)D loader / the same clips decoded from memory ---------------------------------


@dataclass(frozen=True)
class FloorItem:
    """One loader item as the floor makes it: the sampled clip frames and where their distinct frames are."""

    frames: np.ndarray
    read: FloorRead


def floor_items(root: str, floor: InMemoryFloor, start: int, items: int) -> list[FloorItem]:
    """The items 1..`items` a loader seeded `start` makes (item 0 is its warm-up), planned by the loader's own sampler."""
    planner = EpisodeReader(None, None, CLIPS, CLIP_LENGTH, prefetch=0, byte_budget=0, workers=1, seed=start)
    out = []
    for i, request in enumerate(item_requests(root, start, items + 1)[1:], start=1):
        plan: ClipPlan = planner.plan(request, i)
        out.append(FloorItem(plan.frames, floor.read(plan.episode, np.unique(plan.frames))))
    return out


def floor_clips(floor: InMemoryFloor, item: FloorItem) -> torch.Tensor:
    return decode_clips(item.frames, functools.partial(floor.frames, item.read), SIZE, TimeCard(0))


def loader_floor_rows(root: Path, effort: Effort) -> list[Row]:
    """Loader items/s / the same decode, resize and normalisation of the same frames from memory, one thread."""
    items = effort.pick(6, 10)
    local = open_dataset(str(root))
    floor = InMemoryFloor(local, local.video_keys[0])
    setup = LoaderSetup("episode", prefetch=2, workers=1, decode_threads=1)
    with torch_threads(1):
        check = item_requests(str(root), 999, 2)[1]
        (clips,), _, _ = dataclasses.replace(setup, prefetch=0).loader(999)((), {"request": check}, TimeCard(1))
        if not torch.equal(clips, floor_clips(floor, floor_items(str(root), floor, 999, 1)[0])):
            raise AssertionError("the loader and the in-memory decode give different clips")
        starts_a, starts_b = iter(range(1000)), iter(range(1000))
        cards: list[TimeCard] = []

        def in_memory() -> float:
            planned = floor_items(str(root), floor, next(starts_b), items)
            started = time.perf_counter()
            for item in planned:
                floor_clips(floor, item)
            return items / (time.perf_counter() - started)

        row = measure_pair("P10d", "R(2+1)D loader items/s / the same frames decoded, resized and normalised from "
                           "memory (the floor), 1 thread", Goal(">=", 0.85),
                           ("loader", "items/s", lambda: loader_rate(str(root), setup, items, next(starts_a), cards)),
                           ("in memory", "items/s", in_memory), effort.reps)
    note = (f"{items} items per repetition, {CLIPS} clips of {CLIP_LENGTH} frames resized to {SIZE}, from local disk, "
            f"{local.num_episodes} episodes of {resolution(root)} (GOP 30, B-frames); the loader fetches whole "
            "episodes 2 ahead on one thread and decodes on one; clips checked identical. Per loader item (median): "
            f"waiting for its fetch {waited_ms(cards):.0f} ms, decoding {decoding_ms(cards):.0f} ms")
    return [dataclasses.replace(row, note=note)]


def floor_rows(name: str, effort: Effort, roots: Callable[[], dict[int, Path]],
               vga_roots: Callable[[], dict[int, Path]], workdir: Path) -> list[Row]:
    """The rows of benchmark `name` (P3rd or P10d)."""
    if name == "P3rd":
        return windows_floor_rows(roots()[30], workdir, effort)
    if name == "P10d":
        return loader_floor_rows(vga_roots()[30], effort)
    raise ValueError(f"bench/floor_bench.py has no benchmark {name!r}")

