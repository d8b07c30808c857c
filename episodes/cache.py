"""EpisodeByteCache: one episode's frames from its own bytes, with an LRU of mini-MP4s.

A request for (episode, camera) costs, on a miss: the file's MP4 index (built
once per file from range reads, or loaded from the sidecar), the episode span
(lookup), one byte-range read (fetch), a mini-MP4 wrapped around those bytes
(synthesize); then, hit or miss, a torchcodec decode of the frames asked for.
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
from episodes.dataset import EpisodeRecord
from episodes.decode import open_decoder
from episodes.errors import EpisodeDataError, Mp4FormatError
from episodes.sidecar import IndexSidecar, sidecar_path
from episodes.source import EpisodeDataset

T = TypeVar("T")


@dataclass(frozen=True)
class CacheStats:
    """Totals since the cache opened. Times are seconds summed over threads."""

    hits: int = 0
    misses: int = 0
    shared_fetches: int = 0
    evictions: int = 0
    cached_items: int = 0
    cached_bytes: int = 0
    index_builds: int = 0
    index_sidecar_loads: int = 0
    header_reads: int = 0
    header_bytes: int = 0
    bytes_fetched: int = 0
    frames_decoded: int = 0
    lookup_s: float = 0.0
    fetch_s: float = 0.0
    synthesize_s: float = 0.0
    decode_s: float = 0.0


@dataclass(frozen=True)
class FrameRead:
    """The frames of one call and what that call cost, for a model's time card.

    On a hit (or a fetch shared with another thread) bytes_fetched and the
    fetch-side times are 0: the cost was paid by whoever fetched.
    """

    frames: torch.Tensor
    cache_hit: bool
    bytes_fetched: int
    frames_decoded: int
    lookup_s: float
    fetch_s: float
    synthesize_s: float
    decode_s: float


@dataclass(frozen=True)
class _MissCost:
    bytes_fetched: int = 0
    lookup_s: float = 0.0
    fetch_s: float = 0.0
    synthesize_s: float = 0.0


@dataclass
class _Decoder:
    mini: MiniMp4
    decoder: VideoDecoder
    lock: threading.Lock


def _prefixed(exc: BaseException, url: str, where: str) -> EpisodeDataError:
    """The lower error re-worded as `<url>: <where>: <reason>`, keeping its class when it is ours."""
    reason = str(exc)
    if reason.startswith(url + ": "):
        reason = reason[len(url) + 2 :]
    elif not isinstance(exc, EpisodeDataError):
        reason = f"{type(exc).__name__}: {reason}"
    cls = type(exc) if isinstance(exc, EpisodeDataError) else Mp4FormatError
    return cls(f"{url}: {where}: {reason}")


class EpisodeByteCache:
    """Frames of any episode of `ds`, fetching only the episode's bytes.

    Thread-safe. Mini-MP4s are kept in an LRU bounded by `byte_budget`;
    `prefetch` fills it from a pool of `workers` threads; two requests for
    the same (episode, camera) share one fetch. Indexes persist in a sidecar
    (see episodes.sidecar) unless `use_sidecar` is False; `sidecar_dir`
    replaces the cache directory used for roots we cannot write next to.
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
    ) -> None:
        if byte_budget < 0 or workers < 1 or max_decoders < 1 or decode_threads < 0:
            raise ValueError("byte_budget must be >= 0, workers and max_decoders >= 1, decode_threads >= 0")
        self.ds = ds
        self.storage = ds.storage
        self.byte_budget = byte_budget
        self.max_decoders = max_decoders
        self.decode_threads = decode_threads
        self._sidecar_path = sidecar_path(self.storage, sidecar_dir) if use_sidecar else None
        self._sidecar: IndexSidecar | None = None
        self._lock = threading.Lock()
        self._counts: dict[str, Any] = {f.name: f.default for f in fields(CacheStats)}
        self._indexes: dict[str, Future[Mp4Index]] = {}
        self._minis: OrderedDict[tuple[int, str], MiniMp4] = OrderedDict()
        self._inflight: dict[tuple[int, str], Future[MiniMp4]] = {}
        self._decoders: OrderedDict[tuple[int, str, str], _Decoder] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-fetch")
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

    # ---- mini-MP4s -----------------------------------------------------

    def get_mini_mp4(self, ep: int, key: str) -> MiniMp4:
        """The episode's mini-MP4 (picklable: a fetch process can hand it to a decode process)."""
        return self._mini(ep, key)[0]

    def prefetch(self, ep: int, keys: Iterable[str] | None = None) -> list[Future[MiniMp4]]:
        """Start fetching the episode's cameras (all by default) on the thread pool.

        The futures hold the mini-MP4s or the errors; nobody has to wait on them.
        """
        self._check_open()
        return [self._pool.submit(self.get_mini_mp4, ep, key) for key in (self.ds.video_keys if keys is None else keys)]

    def _mini(self, ep: int, key: str) -> tuple[MiniMp4, _MissCost | None]:
        """The mini-MP4 and, when this call fetched it, what fetching cost."""
        self._check_open()
        slot = (int(ep), key)
        with self._lock:
            mini = self._minis.get(slot)
            if mini is not None:
                self._minis.move_to_end(slot)
                self._counts["hits"] += 1
                return mini, None
        cost: list[_MissCost] = []

        def fetch() -> MiniMp4:
            with self._lock:  # a fetch that finished since the check above left it in the LRU
                done = self._minis.get(slot)
            if done is not None:
                return done
            mini, paid = self._fetch(*slot)
            cost.append(paid)
            self._remember(slot, mini)
            return mini

        mini, _ = self._shared(self._inflight, slot, fetch, keep=False, counters=("misses", "shared_fetches"))
        return mini, (cost[0] if cost else None)

    def _record(self, ep: int, key: str) -> EpisodeRecord:
        record = self.ds.episode(ep)
        if key not in record.videos:
            raise ValueError(f"{self.storage.root}: camera {key!r} is not one of {', '.join(record.videos)}")
        return record

    def _fetch(self, ep: int, key: str) -> tuple[MiniMp4, _MissCost]:
        record = self._record(ep, key)
        segment, length = record.videos[key], record.length
        url = self.storage.url(segment.path)
        try:
            t0 = time.perf_counter()
            index = self.mp4_index(segment.path)
            span = episode_span(index, segment.from_timestamp, segment.to_timestamp, expected_frames=length)
            t1 = time.perf_counter()
            payload = self.storage.read_range(segment.path, span.byte_start, span.byte_end)
            t2 = time.perf_counter()
            mini = synthesize_mini_mp4(index, span, payload)
            t3 = time.perf_counter()
        except EpisodeDataError as exc:
            raise _prefixed(exc, url, f"episode {ep}, camera {key}") from exc
        cost = _MissCost(len(payload), t1 - t0, t2 - t1, t3 - t2)
        self._add(bytes_fetched=cost.bytes_fetched, lookup_s=cost.lookup_s, fetch_s=cost.fetch_s,
                  synthesize_s=cost.synthesize_s)
        return mini, cost

    def _remember(self, slot: tuple[int, str], mini: MiniMp4) -> None:
        size = len(mini.data)
        with self._lock:
            if self._closed or size > self.byte_budget:
                return
            self._minis[slot] = mini
            self._counts["cached_bytes"] += size
            while self._counts["cached_bytes"] > self.byte_budget:
                _, old = self._minis.popitem(last=False)
                self._counts["cached_bytes"] -= len(old.data)
                self._counts["evictions"] += 1
            self._counts["cached_items"] = len(self._minis)

    # ---- frames --------------------------------------------------------

    def read(
        self,
        ep: int,
        key: str,
        *,
        timestamps: Sequence[float] | np.ndarray | torch.Tensor | None = None,
        frame_numbers: Sequence[int] | np.ndarray | None = None,
        device: str | torch.device = "cpu",
    ) -> FrameRead:
        """Frames by `timestamps` (seconds from the episode start) or `frame_numbers`, with this call's costs."""
        if (timestamps is None) == (frame_numbers is None):
            raise TypeError("pass exactly one of timestamps and frame_numbers")
        mini, cost = self._mini(ep, key)
        url = self.storage.url(self._record(ep, key).videos[key].path)
        where = f"{url}: episode {ep}, camera {key}"
        if timestamps is not None:
            numbers = frames_at(mini, np.asarray(timestamps, dtype=np.float64), where=where)
        else:
            numbers = np.asarray(frame_numbers, dtype=np.int64).reshape(-1)
            bad = numbers[(numbers < 0) | (numbers >= mini.num_frames)]
            if len(bad):
                raise IndexError(f"{where}: frame {int(bad[0])} is out of range (the episode has {mini.num_frames})")
        t0 = time.perf_counter()
        frames = self._decode((int(ep), key), mini, numbers, str(torch.device(device)), where)
        decode_s = time.perf_counter() - t0
        self._add(frames_decoded=len(numbers), decode_s=decode_s)
        paid = cost or _MissCost()
        return FrameRead(frames, cost is None, paid.bytes_fetched, len(numbers), paid.lookup_s, paid.fetch_s,
                         paid.synthesize_s, decode_s)

    def get_frames(
        self, ep: int, key: str, timestamps: Sequence[float] | np.ndarray | torch.Tensor, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """uint8 (N, C, H, W) frames shown at `timestamps` seconds from the episode start (nearest frame)."""
        return self.read(ep, key, timestamps=timestamps, device=device).frames

    def get_episode_frames(
        self, ep: int, key: str, frame_numbers: Sequence[int] | np.ndarray, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """uint8 (N, C, H, W) frames by their 0-based number within the episode."""
        return self.read(ep, key, frame_numbers=frame_numbers, device=device).frames

    def _decode(self, slot: tuple[int, str], mini: MiniMp4, numbers: np.ndarray, device: str, where: str) -> torch.Tensor:
        if len(numbers) == 0:
            raise ValueError(f"{where}: no frames were asked for")
        dkey = (*slot, device)
        try:
            with self._lock:
                entry = self._decoders.get(dkey)
                if entry is not None and entry.mini is mini:
                    self._decoders.move_to_end(dkey)
                else:
                    entry = None
            if entry is None:
                entry = _Decoder(mini, open_decoder(mini, device, num_threads=self.decode_threads), threading.Lock())
                with self._lock:
                    self._decoders[dkey] = entry
                    while len(self._decoders) > self.max_decoders:
                        self._decoders.popitem(last=False)
            with entry.lock:
                return entry.decoder.get_frames_at(mini.frame_index[numbers].tolist()).data
        except (RuntimeError, ValueError) as exc:
            raise Mp4FormatError(f"{where}: decoding failed ({type(exc).__name__}: {exc})") from exc


def frames_at(mini: MiniMp4, timestamps: np.ndarray, *, where: str) -> np.ndarray:
    """Episode frame numbers shown at `timestamps` seconds after the episode's first frame.

    Each instant maps to the nearest frame and must lie within half a frame
    of it: accumulated-float timestamps such as 0.30000000000000004 still
    find frame 9 at 30 fps, and no float is ever compared for equality.
    """
    seconds = mini.frame_pts_seconds
    relative = seconds - seconds[0]
    half = 0.5 * float(np.median(mini.duration)) / mini.timescale
    flat = timestamps.reshape(-1)
    right = np.clip(np.searchsorted(relative, flat), 1, max(len(relative) - 1, 1))
    left = right - 1
    nearest = np.where(np.abs(relative[np.minimum(right, len(relative) - 1)] - flat) < np.abs(relative[left] - flat),
                       np.minimum(right, len(relative) - 1), left)
    off = np.flatnonzero(~(np.abs(relative[nearest] - flat) <= half * (1 + 1e-9)))
    if len(off):
        t = float(flat[off[0]])
        raise ValueError(
            f"{where}: timestamp {t} s is not within half a frame of any of the episode's {len(relative)} frames"
            f" (0 to {relative[-1]:.6f} s)"
        )
    return nearest.astype(np.int64)
