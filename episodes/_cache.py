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

This module plans and hands out reads; each of their jobs lives apart:
where frames lie (episodes._indexes), whole episodes kept (episodes._whole),
frame windows started and in flight (episodes._window_starts,
episodes._inflight), what fits in memory (episodes._budget) and decoding
(episodes._decoders).
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from os import PathLike

import numpy as np
import torch

from episodes._budget import ByteBudget
from episodes._decoders import Decoders, in_order
from episodes._errors import EpisodeDataError, reworded
from episodes._indexes import FileIndexes
from episodes._inflight import EpisodeInFlight, FetchInFlight, WindowsInFlight
from episodes._mp4 import MiniMp4
from episodes._mp4.windows import frame_windows
from episodes._reads import (
    CacheStats,
    Counts,
    Fetch,
    FetchedFrames,
    FrameRead,
    FrameRequest,
    checked_fetch,
    numbers_at,
)
from episodes._sidecar import sidecar_path
from episodes._source import EpisodeDataset
from episodes._storage import RangeAnswer
from episodes._whole import Entry, WholeEpisodes
from episodes._window_starts import WindowStarts
from episodes._windows import WindowJob

DEFAULT_COALESCE_GAP = 256 * 1024  # LeRobot's --coalesce-gap-kb default


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
        self._ds, self._storage = ds, ds.storage
        self._coalesce_gap = coalesce_gap
        self._closed = False
        self._counts = Counts()
        self._files = FileIndexes(ds, None if cache_dir is None else sidecar_path(self._storage, cache_dir),
                                  self._counts)
        self._budget: ByteBudget[Entry] = ByteBudget(byte_budget)
        self._whole = WholeEpisodes(self._files, self._storage, self._budget, self._counts, lambda: self._closed)
        self._decoders = Decoders(self._files, self._counts, max_decoders=max_decoders, decode_threads=decode_threads)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-fetch")
        self._io = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode-ranges")
        self._reads: set[Future[RangeAnswer]] = set()  # frame-window reads on the wire, cancelled at close
        self._slots = asyncio.Semaphore(workers)  # over HTTP, what the range threads bound elsewhere
        self._windows = WindowStarts(self._start_ranges, self._pool, self._budget, self._plan, self._counts.add,
                                     decode_threads=decode_threads, max_ready=max_decoders)

    def __enter__(self) -> EpisodeByteCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the prefetch threads (queued prefetches are cancelled) and drop decoders and bytes."""
        self._closed = True
        for read in list(self._reads):
            read.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True, cancel_futures=True)
        self._decoders.clear()
        self._budget.clear()

    def stats(self) -> CacheStats:
        """The totals since the cache opened (a snapshot: later reads do not change it)."""
        budget = self._budget
        return replace(self._counts.snapshot(), cached_items=len(budget), cached_bytes=budget.kept_bytes,
                       evictions=budget.evictions, bytes_held=budget.held_bytes, peak_bytes_held=budget.peak,
                       prefetches_skipped=budget.skipped, prefetches_dropped=budget.dropped)

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
            return [EpisodeInFlight(int(r.episode), r.key, functools.partial(self._whole.fetch, r),
                                    self._pool.submit(self._whole.prefetched, int(r.episode), r.key) if ahead else None)
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
            return self._decoders.decode(fetched, str(torch.device(device)))
        reads = [(part.fetched, self._decoders.decode(part.fetched, str(torch.device(device)), part.decoder))
                 for part in fetched.parts()]
        self._waited(fetched)
        first, last = reads[0][1], reads[-1][1]
        frames = reads[0][1].frames if len(reads) == 1 else in_order(reads, fetched.frame_numbers)
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
            self._counts.add(fetch_s=got.wait_s, synthesize_s=got.cut_s)

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
        return [self._pool.submit(self._whole.prefetched, ep, key) for key in keys]

    def index_files(self, paths: Iterable[str]) -> None:
        """Have the MP4 index of each video file ready now (paths relative to the root, as VideoSegment.path).

        From the sidecar when it holds the file as it is, else from the
        file's headers (and then into the sidecar): what a first read of
        the file would otherwise do on its way. The files are indexed
        concurrently. Over HTTP a file the sidecar holds costs no round
        trip: the first range read's answer checks that it is still the
        file indexed (episodes._indexes); elsewhere its info is asked first.
        """
        self._check_open()
        self._files.index_files(paths, self._io)

    # ---- frame windows -----------------------------------------------------

    def _start_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[Future[RangeAnswer]]:
        """A batch's frame-window range reads started: over HTTP on the client's loop, elsewhere on the range
        threads; at most `workers` on the wire at once either way."""
        reads = self._storage.start_ranges(ranges, self._io, self._slots)
        for read in reads:
            self._reads.add(read)
            read.add_done_callback(self._reads.discard)
        return reads

    def _plan(self, request: FrameRequest) -> WindowJob | FetchedFrames:
        """The request's windows, or, when its whole episode is cached, its frames in that mini-MP4."""
        ep, key = int(request.episode), request.key
        record = self._files.record(ep, key)
        if (ep, key) in self._budget:
            return self._whole.fetch(request)
        rel = record.videos[key].path
        started = time.perf_counter()
        try:
            at = self._files.span(record, key)
            index = at.index
            seconds = index.pts_seconds[np.asarray(at.span.frames)]
            numbers = numbers_at(seconds, index.half_frame_s, request, record.length,
                                 self._files.where(record, key))
            windows = frame_windows(index, at.span, numbers)
        except EpisodeDataError as exc:
            raise reworded(exc, self._storage.url(rel), f"episode {ep}, camera {key}") from exc
        return WindowJob(ep, key, rel, self._storage.url(rel), numbers, record.length, index, windows,
                         time.perf_counter() - started, at.claim)
