"""EpisodeByteCache: frames of one episode from that episode's own bytes, fetched one of two ways.

Every read goes fetch, then decode: `fetch_frames` turns requests into
mini-MP4s (FetchedFrames), `decode_frames` turns one of those into frames
(FrameRead), and `read_frames` does both; a caller that must time or place
the two phases apart (a fetch step and a decode step, maybe in other
processes) calls them itself.

fetch="episode" (the default) reads the episode's one byte range, wraps it
into a mini-MP4 and keeps that in an LRU, so later reads of the episode
fetch nothing. fetch="windows" reads only what the asked-for frames need:
for each frame the samples from the sync sample its decoding starts at to
the frame itself (episodes._mp4.windows), windows closer than
`coalesce_gap` bytes merged into one range request, also across episodes of
one file when a batch asks for several, the requests run concurrently, and
a mini-MP4 of just those samples decoded. Either way a request costs: the
file's MP4 index (built once per file from range reads, or loaded from the
sidecar), the span (lookup), the range reads (fetch), the mini-MP4
(synthesize), a torchcodec decode of the frames asked for.

Bytes are accounted honestly: what a read caused to be fetched (its own
fetch, or a prefetch nobody had used yet) is `bytes_fetched`; what it used
that an earlier read had already paid for is `bytes_reused`.
"""
from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from os import PathLike
from typing import Literal, TypeVar

import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from episodes._budget import ByteBudget, Hold
from episodes._dataset import EpisodeRecord
from episodes._decode import decode_backend, decode_mini_mp4, open_decoder
from episodes._errors import EpisodeDataError, Mp4FormatError, reworded
from episodes._inflight import EpisodeInFlight, FetchInFlight, WindowsInFlight
from episodes._mp4 import MiniMp4, Mp4Index, build_index, episode_span, synthesize_mini_mp4
from episodes._mp4.span import EpisodeSpan
from episodes._mp4.windows import frame_windows
from episodes._reads import (
    CacheStats,
    Fetch,
    FetchedFrames,
    FrameRead,
    FrameRequest,
    checked_fetch,
    frame_numbers_of,
    half_frame,
    numbers_at,
)
from episodes._sidecar import IndexSidecar, sidecar_path
from episodes._source import EpisodeDataset
from episodes._window_starts import WindowStarts
from episodes._windows import WindowJob

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
DEFAULT_COALESCE_GAP = 256 * 1024  # LeRobot's --coalesce-gap-kb default
# How a read got its episode's kept mini-MP4: kept already, by joining a fetch in flight, or by fetching it.
Got = Literal["kept", "joined", "fetched"]


@dataclass(frozen=True)
class _Cost:
    """What fetching a whole episode cost, held in its LRU slot until the first read claims it."""

    bytes_fetched: int
    lookup_s: float
    fetch_s: float
    synthesize_s: float


@dataclass
class _Entry:
    """An LRU slot: the mini-MP4, the source bytes it took and, until a read claims it, the cost of fetching it."""

    mini: MiniMp4
    payload_bytes: int
    cost: _Cost | None


@dataclass
class _Decoder:
    mini: MiniMp4
    decoder: VideoDecoder
    lock: threading.Lock


class EpisodeByteCache:
    """Frames of any episode of `ds`, fetching only the bytes they need.

    Thread-safe. Whole-episode mini-MP4s are kept in an LRU; `prefetch`
    fills it from a pool of `workers` threads; two requests for the same
    (episode, camera) share one fetch. Frame windows (fetch="windows") read
    their coalesced ranges on another pool of `workers` threads and are not
    kept. Kept mini-MP4s and the bytes of fetches in flight or not yet
    decoded share `byte_budget` (episodes._budget): a fetch started ahead
    of its reader (`prefetch`, `start_fetch(ahead=True)`) starts only where
    its bytes fit. With `cache_dir`, MP4 indexes
    persist in a sidecar file under it (one directory per dataset root,
    never inside the dataset), so a later cache over the same root reads no
    MP4 header; without, each cache builds them from the headers, once per
    file, and writes nothing.
    """

    def __init__(
        self,
        ds: EpisodeDataset,
        byte_budget: int = 2**30,
        workers: int = 8,
        *,
        cache_dir: str | PathLike[str] | None = None,
        max_decoders: int = 8,
        decode_threads: int = 1,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
    ) -> None:
        if byte_budget < 0 or workers < 1 or max_decoders < 1 or decode_threads < 0 or coalesce_gap < 0:
            raise ValueError("byte_budget and coalesce_gap must be >= 0, workers and max_decoders >= 1, "
                             "decode_threads >= 0")
        self._ds = ds
        self._storage = ds.storage
        self._max_decoders = max_decoders
        self._decode_threads = decode_threads
        self._coalesce_gap = coalesce_gap
        self._sidecar_path = None if cache_dir is None else sidecar_path(self._storage, cache_dir)
        self._sidecar: IndexSidecar | None = None
        self._lock = threading.Lock()
        self._counts: dict[str, int | float] = asdict(CacheStats())
        self._indexes: dict[str, Future[Mp4Index]] = {}
        self._budget: ByteBudget[_Entry] = ByteBudget(byte_budget)
        self._inflight: dict[tuple[int, str], Future[_Entry]] = {}
        self._decoders: OrderedDict[tuple[int, str, str], _Decoder] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-fetch")
        self._io = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-ranges")
        self._windows = WindowStarts(self._storage, self._io, self._pool, self._budget, self._plan, self._add,
                                     decode_threads=decode_threads, max_ready=max_decoders)
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
        self._budget.clear()

    def stats(self) -> CacheStats:
        """The totals since the cache opened (a snapshot: later reads do not change it)."""
        budget = self._budget
        with self._lock:
            counts = CacheStats(**self._counts)  # type: ignore[arg-type]  # the counts are CacheStats' own fields
        return replace(counts, cached_items=len(budget), cached_bytes=budget.kept_bytes, evictions=budget.evictions,
                       bytes_held=budget.held_bytes, peak_bytes_held=budget.peak,
                       prefetches_skipped=budget.skipped, prefetches_dropped=budget.dropped)

    def _add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the EpisodeByteCache is closed")

    # ---- reading frames: fetch, then decode ------------------------------------

    def read_frames(
        self, requests: Sequence[FrameRequest], *, fetch: Fetch = "episode", device: str | torch.device = "cpu",
        coalesce_gap: int | None = None,
    ) -> list[FrameRead]:
        """Each request's frames, uint8 (N, C, H, W) on `device`, with what reading them cost.

        `fetch` "episode" reads each episode whole once and keeps it;
        "windows" reads only the samples these frames need, ranges of one
        file closer than `coalesce_gap` bytes (default: the cache's) merged
        across the requests (see fetch_frames). Every fetch starts at once
        and each request decodes as soon as its bytes are in, the first
        while the others' are still on the wire (see start_fetch).
        """
        started = self.start_fetch(requests, fetch=fetch, coalesce_gap=coalesce_gap, device=device)
        return [self.decode_frames(got, device=device) for got in started]

    def get_frames(
        self, ep: int, key: str, timestamps: Sequence[float] | np.ndarray | torch.Tensor,
        device: str | torch.device = "cpu", fetch: Fetch = "episode",
    ) -> torch.Tensor:
        """uint8 (N, C, H, W) frames shown at `timestamps` seconds from the episode start (read_frames of one request)."""
        return self.read_frames([FrameRequest(ep, key, timestamps=timestamps)], fetch=fetch, device=device)[0].frames

    def fetch_frames(
        self, requests: Sequence[FrameRequest], *, fetch: Fetch = "episode", coalesce_gap: int | None = None,
    ) -> list[FetchedFrames]:
        """The fetch phase: for each request, the mini-MP4 its frames decode from, and what getting it cost.

        With fetch="episode" each request gets its episode's whole mini-MP4,
        from the LRU or fetched and kept. With fetch="windows" the windows
        of all requests are planned first; ranges of one file closer than
        `coalesce_gap` bytes merge into one range request, also across
        episodes, and all requests run concurrently; each request gets a
        mini-MP4 of just its samples, unless its whole episode is already
        cached (then that one: a hit, its bytes reused).
        """
        return [self._fetched(got) for got in self.start_fetch(requests, fetch=fetch, coalesce_gap=coalesce_gap)]

    def start_fetch(
        self, requests: Sequence[FrameRequest], *, fetch: Fetch = "episode", coalesce_gap: int | None = None,
        ahead: bool = False, device: str | torch.device | None = None,
    ) -> list[FetchInFlight]:
        """Start the fetch phase of each request on the cache's threads: one FetchInFlight each, at once.

        Bytes are fetched as fetch_frames says; `result()` waits for them
        whole, `decode_frames` decodes them part by part as they land. With
        `ahead` (a prefetch, for reads to come) nothing is planned on this
        thread, and a fetch starts only where its bytes fit the budget
        beside what is kept and in flight; one that did not, or was dropped
        before its reader came, is fetched when read. With `device` "cpu"
        (where the frames will be decoded), a request's frame-window
        mini-MP4 is cut and its decoder opened as soon as its bytes have
        landed, on the fetch threads, up to `max_decoders` ahead of their
        readers (an NVDEC decoder is opened by its reader).
        """
        self._check_open()
        gap = self._coalesce_gap if coalesce_gap is None else coalesce_gap
        if gap < 0:
            raise ValueError(f"coalesce_gap must be >= 0 bytes, not {gap}")
        if checked_fetch(fetch) == "episode":
            return [EpisodeInFlight(int(r.episode), r.key, functools.partial(self._fetch_episode, r),
                                    self._pool.submit(self._prefetched, int(r.episode), r.key) if ahead else None)
                    for r in requests]
        cpu = device is not None and torch.device(device).type == "cpu"
        return list(self._windows.start(requests, gap, ahead=ahead, cpu=cpu))

    def decode_frames(self, fetched: FetchedFrames | FetchInFlight, *, device: str | torch.device = "cpu") -> FrameRead:
        """The decode phase: a request's frames decoded on `device`, with the whole read's cost.

        Given a FetchedFrames, nothing is looked up or charged again; given
        a FetchInFlight, each of its parts is decoded as soon as its bytes
        have landed and the frames are put together in the order asked.
        The decoder of a whole episode's mini-MP4 is kept for later reads
        of that episode.
        """
        if isinstance(fetched, FetchedFrames):
            return self._decode(fetched, str(torch.device(device)))
        reads = [(part.fetched, self._decode(part.fetched, str(torch.device(device)), part.decoder))
                 for part in fetched.parts()]
        self._waited(fetched)
        first, last = reads[0][1], reads[-1][1]
        frames = reads[0][1].frames if len(reads) == 1 else _in_order(reads, fetched.frame_numbers)
        return FrameRead(frames, last.cache_hit, sum(r.bytes_fetched for _, r in reads),
                         sum(r.bytes_reused for _, r in reads), sum(r.frames_decoded for _, r in reads),
                         first.lookup_s, fetched.wait_s if isinstance(fetched, WindowsInFlight) else last.fetch_s,
                         sum(r.synthesize_s for _, r in reads), sum(r.decode_s for _, r in reads), last.backend)

    def _fetched(self, got: FetchInFlight) -> FetchedFrames:
        """`got` waited for whole, its wait counted."""
        fetched = got.result()
        self._waited(got)
        return fetched

    def _waited(self, got: FetchInFlight) -> None:
        """A windows read's costs, counted once read: its fetch time, the time its reader waited for its bytes,
        and the time cutting its mini-MP4s took (a whole episode's fetch counts its own)."""
        if isinstance(got, WindowsInFlight):
            self._add(fetch_s=got.wait_s, synthesize_s=got.cut_s)

    def _decode(self, fetched: FetchedFrames, device: str, opened: VideoDecoder | None = None) -> FrameRead:
        """One mini-MP4's frames decoded on `device` (by `opened`, a CPU decoder already open over a frame-window
        mini-MP4, where given), with the cost of the read that fetched it."""
        ep, key, mini = int(fetched.episode), fetched.key, fetched.mini
        t0 = time.perf_counter()
        try:
            if mini.whole_episode:
                entry = self._kept_decoder((ep, key, device), mini)
                with entry.lock:
                    frames = decode_mini_mp4(mini, fetched.frame_numbers, decoder=entry.decoder)
                    backend = decode_backend(entry.decoder, device)
            else:
                decoder = opened if opened is not None and device == "cpu" else \
                    open_decoder(mini, device, num_threads=self._decode_threads)
                frames = decode_mini_mp4(mini, fetched.frame_numbers, decoder=decoder)
                backend = decode_backend(decoder, device)
        except (RuntimeError, ValueError) as exc:
            where = self._where(self._ds.episode(ep), key)
            raise Mp4FormatError(f"{where}: decoding failed ({type(exc).__name__}: {exc})") from exc
        decode_s = time.perf_counter() - t0
        count = len(fetched.frame_numbers)
        self._add(frames_decoded=count, decode_s=decode_s)
        return FrameRead(frames, fetched.cache_hit, fetched.bytes_fetched, fetched.bytes_reused, count,
                         fetched.lookup_s, fetched.fetch_s, fetched.synthesize_s, decode_s, backend)

    def _kept_decoder(self, dkey: tuple[int, str, str], mini: MiniMp4) -> _Decoder:
        """The decoder kept for this episode's mini-MP4 on this device, opened if missing or stale."""
        with self._lock:
            entry = self._decoders.get(dkey)
            if entry is not None and entry.mini is mini:
                self._decoders.move_to_end(dkey)
                return entry
        entry = _Decoder(mini, open_decoder(mini, dkey[2], num_threads=self._decode_threads), threading.Lock())
        with self._lock:
            self._decoders[dkey] = entry
            while len(self._decoders) > self._max_decoders:
                self._decoders.popitem(last=False)
        return entry

    # ---- ahead of reads ------------------------------------------------------

    def prefetch(self, ep: int, keys: Iterable[str] | None = None) -> list[Future[MiniMp4 | None]]:
        """Start fetching the episode's cameras (all by default) whole, into the LRU, on the thread pool.

        The futures hold the mini-MP4s, None where one did not fit the byte
        budget beside what is kept and in flight, or the errors; nobody has
        to wait on them. The first read that uses a prefetched mini-MP4 is
        charged its bytes.
        """
        self._check_open()
        keys = self._ds.video_keys if keys is None else keys
        return [self._pool.submit(self._prefetched, ep, key) for key in keys]

    def _prefetched(self, ep: int, key: str) -> MiniMp4 | None:
        """The episode's mini-MP4 fetched ahead and kept: only where its bytes fit the budget (else None)."""
        slot = (int(ep), key)
        kept = self._budget.get(slot)
        if kept is not None:
            return kept.mini
        record = self._record(*slot)
        try:
            span = self._span(record, key)[1]
        except EpisodeDataError as exc:
            raise reworded(exc, self._storage.url(record.videos[key].path), f"episode {ep}, camera {key}") from exc
        hold = self._budget.hold_ahead(span.num_bytes)
        if hold is None:
            return None
        try:
            entry, got = self._entry(*slot, hold)
        finally:
            self._budget.release(hold)  # already let go of where this fetch kept its mini-MP4
        return entry.mini

    def index_files(self, paths: Iterable[str]) -> None:
        """Have the MP4 index of each video file ready now (paths relative to the root, as VideoSegment.path).

        From the sidecar when it holds the file as it is, else from the
        file's headers (and then into the sidecar): what a first read of
        the file would otherwise do on its way. The files are indexed
        concurrently: each costs a round trip at least (the sidecar checks
        that the file is still the one it indexed).
        """
        self._check_open()
        for _ in self._io.map(self._index, list(dict.fromkeys(paths))):
            pass

    # ---- indexes -------------------------------------------------------

    def _shared(
        self, table: dict[K, Future[T]], key: K, make: Callable[[], T], *, keep: bool,
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
            if future is None:
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

    def _index(self, rel: str) -> Mp4Index:
        """The index of video file `rel`, built at most once per cache (and once per dataset with the sidecar)."""
        return self._shared(self._indexes, rel, lambda: self._load_index(rel), keep=True)[0]

    def _load_index(self, rel: str) -> Mp4Index:
        url = self._storage.url(rel)
        info = self._storage.info(rel)
        sidecar = self._open_sidecar()
        index = sidecar.lookup(rel, info, name=url) if sidecar else None
        if index is not None:
            self._add(index_sidecar_loads=1)
            return index

        def read(start: int, end: int) -> bytes:
            data = self._storage.read_range(rel, start, end)
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

    def _fetch_episode(self, request: FrameRequest) -> FetchedFrames:
        """The request's frames in its episode's whole mini-MP4, from the LRU or fetched, and its cost."""
        ep, key = int(request.episode), request.key
        record = self._record(ep, key)
        entry, got = self._entry(ep, key)
        numbers = frame_numbers_of(entry.mini, request, record.length, self._where(record, key))
        with self._lock:
            cost, entry.cost = entry.cost, None
            if cost is None:
                self._counts["bytes_reused"] += entry.payload_bytes
        if cost is None:
            return FetchedFrames(ep, key, numbers, entry.mini, got == "kept", 0, entry.payload_bytes)
        return FetchedFrames(ep, key, numbers, entry.mini, got == "kept", cost.bytes_fetched, 0, cost.lookup_s,
                             cost.fetch_s, cost.synthesize_s, fetched_ahead=got != "fetched")

    def _entry(self, ep: int, key: str, hold: Hold | None = None) -> tuple[_Entry, Got]:
        """The episode's LRU slot, fetched (or joined while another caller fetches it) on a miss; and how it was got.

        Its cost stays in the slot for the first read to claim
        (_fetch_episode). A fetch made here holds its bytes by `hold`, or by
        a hold of its own for a read asked for now.
        """
        self._check_open()
        slot = (int(ep), key)
        kept = self._budget.get(slot)
        if kept is not None:
            self._add(hits=1)
            return kept, "kept"

        def fetch() -> _Entry:
            done = self._budget.get(slot)  # a fetch that finished since the check above left it in the LRU
            if done is not None:
                return done
            entry, held = self._fetch(*slot, hold)
            started = time.perf_counter()
            with self._lock:
                closed = self._closed
            if closed:
                self._budget.release(held)
            else:
                self._budget.keep(slot, entry, len(entry.mini.data), held)
            self._add(store_s=time.perf_counter() - started)
            return entry

        entry, made = self._shared(self._inflight, slot, fetch, keep=False, counters=("misses", "shared_fetches"))
        return entry, "fetched" if made else "joined"

    def _record(self, ep: int, key: str) -> EpisodeRecord:
        record = self._ds.episode(ep)
        if key not in record.videos:
            raise ValueError(f"{self._storage.root}: episode {ep}: camera {key!r} is not one of "
                             f"{', '.join(record.videos)}")
        return record

    def _where(self, record: EpisodeRecord, key: str) -> str:
        """How a message names the episode-camera: its video file's URL, the episode and the camera."""
        return f"{self._storage.url(record.videos[key].path)}: episode {record.index}, camera {key}"

    def _span(self, record: EpisodeRecord, key: str) -> tuple[Mp4Index, EpisodeSpan]:
        segment = record.videos[key]
        index = self._index(segment.path)
        return index, episode_span(index, segment.from_timestamp, segment.to_timestamp, expected_frames=record.length)

    def _fetch(self, ep: int, key: str, hold: Hold | None) -> tuple[_Entry, Hold]:
        """The episode's bytes read and wrapped, and what holds them: `hold`, else a hold taken now for them.

        A hold taken here is let go of if the fetch fails.
        """
        record = self._record(ep, key)
        url = self._storage.url(record.videos[key].path)
        t0 = time.perf_counter()
        try:
            index, span = self._span(record, key)
        except EpisodeDataError as exc:
            raise reworded(exc, url, f"episode {ep}, camera {key}") from exc
        t1 = time.perf_counter()
        held = self._budget.hold_now(span.num_bytes) if hold is None else hold
        try:
            payload = self._storage.read_range(record.videos[key].path, span.byte_start, span.byte_end)
            t2 = time.perf_counter()
            mini = synthesize_mini_mp4(index, span, payload)
            t3 = time.perf_counter()
        except BaseException as exc:
            if hold is None:
                self._budget.release(held)
            if isinstance(exc, EpisodeDataError):
                raise reworded(exc, url, f"episode {ep}, camera {key}") from exc
            raise
        useful = int(index.size[np.asarray(span.frames)].sum())
        self._add(bytes_fetched=len(payload), bytes_planned=len(payload), bytes_useful=useful, range_requests=1,
                  lookup_s=t1 - t0, fetch_s=t2 - t1, synthesize_s=t3 - t2)
        return _Entry(mini, len(payload), _Cost(len(payload), t1 - t0, t2 - t1, t3 - t2)), held

    # ---- frame windows -----------------------------------------------------

    def _plan(self, request: FrameRequest) -> WindowJob | FetchedFrames:
        """The request's windows, or, when its whole episode is cached, its frames in that mini-MP4."""
        ep, key = int(request.episode), request.key
        record = self._record(ep, key)
        if (ep, key) in self._budget:
            return self._fetch_episode(request)
        rel = record.videos[key].path
        started = time.perf_counter()
        try:
            index, span = self._span(record, key)
            seconds = index.pts[np.asarray(span.frames)] / index.timescale
            numbers = numbers_at(seconds, half_frame(index.duration, index.timescale), request, record.length,
                                 self._where(record, key))
            windows = frame_windows(index, span, numbers)
        except EpisodeDataError as exc:
            raise reworded(exc, self._storage.url(rel), f"episode {ep}, camera {key}") from exc
        return WindowJob(ep, key, rel, self._storage.url(rel), numbers, record.length, index, windows,
                         time.perf_counter() - started)


def _in_order(reads: Sequence[tuple[FetchedFrames, FrameRead]], numbers: np.ndarray) -> torch.Tensor:
    """The frames of a read's parts, each part's distinct frames ascending, in the order the request asked: `numbers`."""
    held = np.concatenate([part.frame_numbers for part, _ in reads])
    frames = torch.cat([read.frames for _, read in reads])
    order = np.argsort(held, kind="stable")
    pick = order[np.searchsorted(held[order], numbers)]
    return frames[torch.from_numpy(pick).to(frames.device)]
