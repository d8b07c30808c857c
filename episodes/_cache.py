"""EpisodeByteCache: frames of one episode from that episode's own bytes, fetched one of two ways.

fetch="episode" (the default) reads the episode's one byte range, wraps it
into a mini-MP4 and keeps that in an LRU, so later reads of the episode
fetch nothing. fetch="windows" reads only what the asked-for frames need:
for each frame the samples from the sync sample its decoding starts at to
the frame itself (episodes._mp4.windows), windows closer than
`coalesce_gap` bytes merged into one range request, also across episodes of
one file when a batch asks for several (read_many), the requests run
concurrently, and a mini-MP4 of just those samples decoded. Either way a
request costs: the file's MP4 index (built once per file from range reads,
or loaded from the sidecar), the span (lookup), the range reads (fetch), the
mini-MP4 (synthesize), a torchcodec decode of the frames asked for.

Bytes are accounted honestly: what a read caused to be fetched (its own
fetch, or a prefetch nobody had used yet) is `bytes_fetched`; what it used
that an earlier read had already paid for is `bytes_reused`.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from episodes._mp4 import MiniMp4, Mp4Index, build_index, episode_span, synthesize_mini_mp4
from episodes._mp4.span import EpisodeSpan
from episodes._mp4.windows import frame_windows
from episodes._dataset import EpisodeRecord
from episodes._decode import open_decoder
from episodes._errors import EpisodeDataError, Mp4FormatError, reworded
from episodes._reads import (CacheStats, FrameRead, FrameRequest, MiniRead, fetch_mode, frame_numbers_of, half_frame,
                             numbers_at)
from episodes._sidecar import IndexSidecar, sidecar_path
from episodes._source import EpisodeDataset
from episodes._windows import RangeBatch, WindowJob, fetch_ranges, window_mini

T = TypeVar("T")
DEFAULT_COALESCE_GAP = 256 * 1024  # LeRobot's --coalesce-gap-kb default


@dataclass
class _Entry:
    """An LRU slot: the mini-MP4, the source bytes it took and, until a read claims it, the cost of fetching it."""

    mini: MiniMp4
    payload_bytes: int
    cost: MiniRead | None


@dataclass
class _Decoder:
    mini: MiniMp4
    decoder: VideoDecoder
    lock: threading.Lock


class EpisodeByteCache:
    """Frames of any episode of `ds`, fetching only the bytes they need.

    Thread-safe. Whole-episode mini-MP4s are kept in an LRU bounded by
    `byte_budget`; `prefetch` fills it from a pool of `workers` threads; two
    requests for the same (episode, camera) share one fetch. Frame windows
    (fetch="windows") read their coalesced ranges on another pool of
    `workers` threads and are not kept. Indexes persist in a sidecar (see
    episodes._sidecar) unless `use_sidecar` is False; `sidecar_dir` replaces
    the cache directory used for roots we cannot write next to.
    """

    def __init__(
        self,
        ds: EpisodeDataset,
        byte_budget: int = 2**30,
        workers: int = 8,
        sidecar_dir: str | PathLike | None = None,
        *,
        use_sidecar: bool = True,
        max_decoders: int = 8,
        decode_threads: int = 1,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
    ) -> None:
        if byte_budget < 0 or workers < 1 or max_decoders < 1 or decode_threads < 0 or coalesce_gap < 0:
            raise ValueError("byte_budget and coalesce_gap must be >= 0, workers and max_decoders >= 1, "
                             "decode_threads >= 0")
        self.ds = ds
        self.storage = ds.storage
        self.byte_budget = byte_budget
        self.max_decoders = max_decoders
        self.decode_threads = decode_threads
        self.coalesce_gap = coalesce_gap
        self._sidecar_path = sidecar_path(self.storage, sidecar_dir) if use_sidecar else None
        self._sidecar: IndexSidecar | None = None
        self._lock = threading.Lock()
        self._counts: dict[str, Any] = {f.name: f.default for f in fields(CacheStats)}
        self._indexes: dict[str, Future[Mp4Index]] = {}
        self._minis: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._inflight: dict[tuple[int, str], Future[_Entry]] = {}
        self._decoders: OrderedDict[tuple[int, str, str], _Decoder] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-fetch")
        self._io = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-ranges")
        self._closed = False

    def __enter__(self) -> EpisodeByteCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the prefetch threads (queued prefetches are cancelled) and drop decoders and bytes."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._decoders.clear()
            self._minis.clear()
            self._counts.update(cached_items=0, cached_bytes=0)

    @property
    def sidecar_path(self) -> Path | None:
        """Where indexes persist, or None when the sidecar is off."""
        return self._sidecar_path

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._counts)

    def _add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the EpisodeByteCache is closed")

    # ---- indexes -------------------------------------------------------

    def _shared(
        self, table: dict[Any, Future[T]], key: Any, make: Callable[[], T], *, keep: bool,
        counters: tuple[str, str] | None = None,
    ) -> tuple[T, bool]:
        """`make()` run once per key while it is in flight; other callers wait for its result.

        Returns the value and whether this caller made it. `keep` leaves the
        finished future in `table` as a memo; a failed attempt is always
        forgotten, so a later call tries again. `counters` names the counts
        to bump for the maker and for a caller that joins it.
        """
        with self._lock:
            future = table.get(key)
            owner = future is None
            if owner:
                future = table[key] = Future()
            if counters:
                self._counts[counters[0] if owner else counters[1]] += 1
        if not owner:
            return future.result(), False
        try:
            value = make()
        except BaseException as exc:
            with self._lock:
                del table[key]
            future.set_exception(exc)
            raise
        if not keep:
            with self._lock:
                del table[key]
        future.set_result(value)
        return value, True

    def mp4_index(self, rel: str) -> Mp4Index:
        """The index of video file `rel`, built at most once per cache (and once per dataset with the sidecar)."""
        return self._shared(self._indexes, rel, lambda: self._load_index(rel), keep=True)[0]

    def _load_index(self, rel: str) -> Mp4Index:
        url = self.storage.url(rel)
        info = self.storage.info(rel)
        sidecar = self._open_sidecar()
        index = sidecar.lookup(rel, info, name=url) if sidecar else None
        if index is not None:
            self._add(index_sidecar_loads=1)
            return index

        def read(start: int, end: int) -> bytes:
            data = self.storage.read_range(rel, start, end)
            self._add(header_reads=1, header_bytes=len(data))
            return data

        index = build_index(read, info.size, name=url)
        self._add(index_builds=1)
        if sidecar:
            sidecar.store(rel, info, index)
        return index

    def _open_sidecar(self) -> IndexSidecar | None:
        if self._sidecar_path is None:
            return None
        with self._lock:
            if self._sidecar is None:
                self._sidecar = IndexSidecar(self._sidecar_path)
            return self._sidecar

    # ---- whole-episode mini-MP4s ------------------------------------------

    def get_mini_mp4(self, ep: int, key: str) -> MiniMp4:
        """The episode's mini-MP4 (picklable: a fetch process can hand it to a decode process)."""
        return self.fetch_mini_mp4(ep, key).mini

    def fetch_mini_mp4(self, ep: int, key: str) -> MiniRead:
        """The episode's whole mini-MP4 and what getting it cost this call."""
        return self._mini(ep, key, claim=True)

    def prefetch(self, ep: int, keys: Iterable[str] | None = None) -> list[Future[MiniMp4]]:
        """Start fetching the episode's cameras (all by default) on the thread pool.

        The futures hold the mini-MP4s or the errors; nobody has to wait on
        them. The first read that uses a prefetched mini-MP4 is charged its bytes.
        """
        self._check_open()
        keys = self.ds.video_keys if keys is None else keys
        return [self._pool.submit(lambda k=key: self._mini(ep, k, claim=False).mini) for key in keys]

    def _mini(self, ep: int, key: str, *, claim: bool) -> MiniRead:
        """The mini-MP4 and its cost to this caller; `claim` False (a prefetch) leaves the cost to the first reader."""
        self._check_open()
        slot = (int(ep), key)
        with self._lock:
            entry = self._minis.get(slot)
            if entry is not None:
                self._minis.move_to_end(slot)
                self._counts["hits"] += 1
        if entry is not None:
            return self._charge(entry, hit=True, claim=claim)

        def fetch() -> _Entry:
            with self._lock:  # a fetch that finished since the check above left it in the LRU
                done = self._minis.get(slot)
            if done is not None:
                return done
            entry = self._fetch(*slot)
            self._remember(slot, entry)
            return entry

        entry, _ = self._shared(self._inflight, slot, fetch, keep=False, counters=("misses", "shared_fetches"))
        return self._charge(entry, hit=False, claim=claim)

    def _charge(self, entry: _Entry, *, hit: bool, claim: bool) -> MiniRead:
        """Hand the entry's unclaimed fetch cost to this caller if it reads; otherwise it reuses the bytes."""
        with self._lock:
            cost = entry.cost if claim else None
            if cost is not None:
                entry.cost = None
            elif claim:
                self._counts["bytes_reused"] += entry.payload_bytes
        if cost is not None:
            return MiniRead(entry.mini, hit, cost.bytes_fetched, 0, cost.lookup_s, cost.fetch_s, cost.synthesize_s)
        return MiniRead(entry.mini, hit, 0, entry.payload_bytes if claim else 0)

    def _record(self, ep: int, key: str) -> EpisodeRecord:
        record = self.ds.episode(ep)
        if key not in record.videos:
            raise ValueError(f"{self.storage.root}: episode {ep}: camera {key!r} is not one of {', '.join(record.videos)}")
        return record

    def _span(self, record: EpisodeRecord, key: str) -> tuple[Mp4Index, EpisodeSpan]:
        segment = record.videos[key]
        index = self.mp4_index(segment.path)
        return index, episode_span(index, segment.from_timestamp, segment.to_timestamp, expected_frames=record.length)

    def _fetch(self, ep: int, key: str) -> _Entry:
        record = self._record(ep, key)
        url = self.storage.url(record.videos[key].path)
        try:
            t0 = time.perf_counter()
            index, span = self._span(record, key)
            t1 = time.perf_counter()
            payload = self.storage.read_range(record.videos[key].path, span.byte_start, span.byte_end)
            t2 = time.perf_counter()
            mini = synthesize_mini_mp4(index, span, payload)
            t3 = time.perf_counter()
        except EpisodeDataError as exc:
            raise reworded(exc, url, f"episode {ep}, camera {key}") from exc
        own = int(index.size[np.asarray(span.frames)].sum())
        self._add(bytes_fetched=len(payload), bytes_planned=len(payload), bytes_useful=own, range_requests=1,
                  lookup_s=t1 - t0, fetch_s=t2 - t1, synthesize_s=t3 - t2)
        cost = MiniRead(mini, False, len(payload), 0, t1 - t0, t2 - t1, t3 - t2)
        return _Entry(mini, len(payload), cost)

    def _remember(self, slot: tuple[int, str], entry: _Entry) -> None:
        started = time.perf_counter()
        size = len(entry.mini.data)
        with self._lock:
            if self._closed or size > self.byte_budget:
                return
            self._minis[slot] = entry
            self._counts["cached_bytes"] += size
            while self._counts["cached_bytes"] > self.byte_budget:
                _, old = self._minis.popitem(last=False)
                self._counts["cached_bytes"] -= len(old.mini.data)
                self._counts["evictions"] += 1
            self._counts["cached_items"] = len(self._minis)
            self._counts["store_s"] += time.perf_counter() - started

    # ---- frame windows -----------------------------------------------------

    def fetch_windows(self, requests: Sequence[FrameRequest], *, coalesce_gap: int | None = None) -> list[MiniRead]:
        """For each request, a mini-MP4 holding just its frames (and the samples they need), and its cost.

        The windows of all requests are planned first; ranges of one file
        closer than `coalesce_gap` bytes (default: the cache's) merge into one
        range request, also across episodes, and all requests run
        concurrently. A request whose whole episode is already cached uses
        that mini-MP4 instead (a hit, its bytes reused).
        """
        return [read for read, _, _ in self._window_reads(requests, coalesce_gap)]

    def _window_reads(self, requests: Sequence[FrameRequest],
                      coalesce_gap: int | None) -> list[tuple[MiniRead, np.ndarray, str]]:
        """Each request's mini-MP4 read, its frame numbers in the order asked, and its place for messages."""
        plans, batch = self._fetch_plans(requests, coalesce_gap)
        out = []
        for plan in plans:
            if isinstance(plan, WindowJob):
                read = window_mini(plan, batch.blobs[id(plan)], batch.charged[id(plan)], batch.waited[id(plan)])
                self._add(synthesize_s=read.synthesize_s)
                out.append((read, plan.numbers, plan.where))
            else:
                out.append(plan)
        return out

    def _fetch_plans(self, requests: Sequence[FrameRequest], coalesce_gap: int | None,
                     ) -> tuple[list[WindowJob | tuple[MiniRead, np.ndarray, str]], RangeBatch]:
        """Each request planned (windows, or a cached episode's mini-MP4), and the batch's ranges read."""
        self._check_open()
        gap = self.coalesce_gap if coalesce_gap is None else coalesce_gap
        if gap < 0:
            raise ValueError(f"coalesce_gap must be >= 0 bytes, not {gap}")
        plans = [self._plan(request) for request in requests]
        jobs = [plan for plan in plans if isinstance(plan, WindowJob)]
        batch = fetch_ranges(self.storage, self._io, jobs, gap)
        self._add(range_requests=batch.range_requests, bytes_useful=batch.useful_bytes)
        for job in jobs:
            w = job.windows
            self._add(misses=1, windows=len(w.frame_numbers), window_runs=len(w.runs), bytes_planned=w.planned_bytes,
                      bytes_fetched=batch.charged[id(job)], lookup_s=job.lookup_s, fetch_s=batch.waited[id(job)])
        return plans, batch

    def _plan(self, request: FrameRequest) -> WindowJob | tuple[MiniRead, np.ndarray, str]:
        """The request's windows, or, when its whole episode is cached, that mini-MP4 and the frame numbers."""
        if (request.timestamps is None) == (request.frame_numbers is None):
            raise TypeError("pass exactly one of timestamps and frame_numbers")
        ep, key = int(request.episode), request.key
        record = self._record(ep, key)
        rel = record.videos[key].path
        where = f"{self.storage.url(rel)}: episode {ep}, camera {key}"
        with self._lock:
            entry = self._minis.get((ep, key))
        if entry is not None:
            read = self._mini(ep, key, claim=True)
            return read, frame_numbers_of(read.mini, request, record.length, where), where
        started = time.perf_counter()
        try:
            index, span = self._span(record, key)
            seconds = index.pts[np.asarray(span.frames)] / index.timescale
            numbers = numbers_at(seconds, half_frame(index.duration, index.timescale), request, record.length, where)
            windows = frame_windows(index, span, numbers)
        except EpisodeDataError as exc:
            raise reworded(exc, self.storage.url(rel), f"episode {ep}, camera {key}") from exc
        return WindowJob(ep, key, rel, self.storage.url(rel), numbers, record.length, index, windows,
                         time.perf_counter() - started)

    # ---- frames --------------------------------------------------------

    def read(
        self,
        ep: int,
        key: str,
        *,
        timestamps: Sequence[float] | np.ndarray | torch.Tensor | None = None,
        frame_numbers: Sequence[int] | np.ndarray | None = None,
        device: str | torch.device = "cpu",
        fetch: str = "episode",
    ) -> FrameRead:
        """Frames by `timestamps` (seconds from the episode start) or `frame_numbers`, with this call's costs.

        `fetch` "episode" reads the whole episode once and keeps it;
        "windows" reads only the samples these frames need (see read_many).
        """
        request = FrameRequest(ep, key, timestamps, frame_numbers)
        if fetch_mode(fetch) == "windows":
            return self.read_many([request], device=device)[0]
        if (timestamps is None) == (frame_numbers is None):
            raise TypeError("pass exactly one of timestamps and frame_numbers")
        got = self._mini(ep, key, claim=True)
        record = self._record(ep, key)
        where = f"{self.storage.url(record.videos[key].path)}: episode {ep}, camera {key}"
        numbers = frame_numbers_of(got.mini, request, record.length, where)
        return self._frames(got, numbers, (int(ep), key), str(torch.device(device)), where)

    def read_many(self, requests: Sequence[FrameRequest], *, device: str | torch.device = "cpu",
                  coalesce_gap: int | None = None) -> list[FrameRead]:
        """Frames of many requests fetched as frame windows, coalesced across requests of one file (fetch_windows).

        Each request decodes from its own mini-MP4. (One mini-MP4 per file
        for all its requests was tried: torchcodec's seek between scattered
        frames cost as much as opening a decoder, so it gained nothing.)
        """
        device = str(torch.device(device))
        return [self._frames(got, numbers, (int(request.episode), request.key), device, where)
                for request, (got, numbers, where) in zip(requests, self._window_reads(requests, coalesce_gap))]

    def decode(self, got: MiniRead, ep: int, key: str, frame_numbers: Sequence[int] | np.ndarray,
               device: str | torch.device = "cpu") -> FrameRead:
        """Episode frames `frame_numbers` decoded from a mini-MP4 this cache handed out, with its costs.

        For callers that fetch first and decode later (fetch_mini_mp4 or
        fetch_windows, then decode): nothing is looked up or charged again.
        """
        record = self._record(ep, key)
        where = f"{self.storage.url(record.videos[key].path)}: episode {int(ep)}, camera {key}"
        numbers = numbers_at(got.mini.frame_pts_seconds, 0.0, FrameRequest(ep, key, frame_numbers=frame_numbers),
                             record.length, where)
        return self._frames(got, numbers, (int(ep), key), str(torch.device(device)), where)

    def get_frames(
        self, ep: int, key: str, timestamps: Sequence[float] | np.ndarray | torch.Tensor,
        device: str | torch.device = "cpu", fetch: str = "episode",
    ) -> torch.Tensor:
        """uint8 (N, C, H, W) frames shown at `timestamps` seconds from the episode start (nearest frame)."""
        return self.read(ep, key, timestamps=timestamps, device=device, fetch=fetch).frames

    def get_episode_frames(
        self, ep: int, key: str, frame_numbers: Sequence[int] | np.ndarray, device: str | torch.device = "cpu",
        fetch: str = "episode",
    ) -> torch.Tensor:
        """uint8 (N, C, H, W) frames by their 0-based number within the episode."""
        return self.read(ep, key, frame_numbers=frame_numbers, device=device, fetch=fetch).frames

    def _frames(self, got: MiniRead, numbers: np.ndarray, slot: tuple[int, str], device: str,
                where: str) -> FrameRead:
        """Decode `numbers` from the mini-MP4, keeping the decoder of a whole episode's for later reads of `slot`."""
        t0 = time.perf_counter()
        frames = self._decode(slot if got.mini.whole_episode else None, got.mini, numbers, device, where)
        decode_s = time.perf_counter() - t0
        self._add(frames_decoded=len(numbers), decode_s=decode_s)
        return FrameRead(frames, got.cache_hit, got.bytes_fetched, got.bytes_reused, len(numbers), got.lookup_s,
                         got.fetch_s, got.synthesize_s, decode_s)

    def _decode(self, slot: tuple[int, str] | None, mini: MiniMp4, numbers: np.ndarray, device: str,
                where: str) -> torch.Tensor:
        if len(numbers) == 0:
            raise ValueError(f"{where}: no frames were asked for")
        try:
            positions = mini.mini_frames(numbers).tolist()
            if slot is None:
                return open_decoder(mini, device, num_threads=self.decode_threads).get_frames_at(positions).data
            entry = self._kept_decoder((*slot, device), mini)
            with entry.lock:
                return entry.decoder.get_frames_at(positions).data
        except (RuntimeError, ValueError) as exc:
            raise Mp4FormatError(f"{where}: decoding failed ({type(exc).__name__}: {exc})") from exc

    def _kept_decoder(self, dkey: tuple[int, str, str], mini: MiniMp4) -> _Decoder:
        """The decoder kept for this episode's mini-MP4 on this device, opened if missing or stale."""
        with self._lock:
            entry = self._decoders.get(dkey)
            if entry is not None and entry.mini is mini:
                self._decoders.move_to_end(dkey)
                return entry
        entry = _Decoder(mini, open_decoder(mini, dkey[2], num_threads=self.decode_threads), threading.Lock())
        with self._lock:
            self._decoders[dkey] = entry
            while len(self._decoders) > self.max_decoders:
                self._decoders.popitem(last=False)
        return entry
