"""Whole episodes: an episode's one byte range fetched, wrapped into a mini-MP4 and kept in the cache's LRU.

fetch="episode" reads this way, and so does a prefetch: later reads of the
episode fetch nothing. Two readers of one episode-camera share one fetch;
the first read that uses a fetched mini-MP4 is charged what fetching it
cost (a prefetch's bytes too), every later one its bytes as reused.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from episodes._budget import ByteBudget, Hold
from episodes._errors import EpisodeDataError, reworded
from episodes._indexes import FileIndexes, StaleIndex
from episodes._mp4 import MiniMp4, synthesize_mini_mp4
from episodes._once import OncePerKey
from episodes._reads import Counts, FetchedFrames, FrameRequest, frame_numbers_of
from episodes._storage import Storage

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
class Entry:
    """An LRU slot: the mini-MP4, the source bytes it took and, until a read claims it, the cost of fetching it."""

    mini: MiniMp4
    payload_bytes: int
    cost: _Cost | None


class WholeEpisodes:
    """A cache's whole-episode mini-MP4s, kept in `budget` (see the module); `closed` says the cache has closed."""

    def __init__(self, files: FileIndexes, storage: Storage, budget: ByteBudget[Entry], counts: Counts,
                 closed: Callable[[], bool]) -> None:
        self._files, self._storage, self._budget, self._counts = files, storage, budget, counts
        self._closed = closed
        self._claims = threading.Lock()
        self._inflight: OncePerKey[tuple[int, str], Entry] = OncePerKey(keep=False)

    def fetch(self, request: FrameRequest) -> FetchedFrames:
        """The request's frames in its episode's whole mini-MP4, from the LRU or fetched, and its cost."""
        ep, key = int(request.episode), request.key
        record = self._files.record(ep, key)
        entry, got = self._entry(ep, key)
        numbers = frame_numbers_of(entry.mini, request, record.length, self._files.where(record, key))
        with self._claims:
            cost, entry.cost = entry.cost, None  # claimed by one reader only
        if cost is None:
            self._counts.add(bytes_reused=entry.payload_bytes)
            return FetchedFrames(ep, key, numbers, entry.mini, got == "kept", 0, entry.payload_bytes)
        return FetchedFrames(ep, key, numbers, entry.mini, got == "kept", cost.bytes_fetched, 0, cost.lookup_s,
                             cost.fetch_s, cost.synthesize_s, fetched_ahead=got != "fetched")

    def prefetched(self, ep: int, key: str) -> MiniMp4 | None:
        """The episode's mini-MP4 fetched ahead and kept: only where its bytes fit the budget (else None)."""
        slot = (int(ep), key)
        kept = self._budget.get(slot)
        if kept is not None:
            return kept.mini
        record = self._files.record(*slot)
        try:
            span = self._files.span(record, key).span
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

    def _entry(self, ep: int, key: str, hold: Hold | None = None) -> tuple[Entry, Got]:
        """The episode's LRU slot, fetched (or joined while another caller fetches it) on a miss; and how it was got.

        Its cost stays in the slot for the first read to claim (fetch). A
        fetch made here holds its bytes by `hold`, or by a hold of its own
        for a read asked for now.
        """
        if self._closed():
            raise RuntimeError("the EpisodeByteCache is closed")
        slot = (int(ep), key)
        kept = self._budget.get(slot)
        if kept is not None:
            self._counts.add(hits=1)
            return kept, "kept"

        def fetch() -> Entry:
            done = self._budget.get(slot)  # a fetch that finished since the check above left it in the LRU
            if done is not None:
                return done
            entry, held = self._fetch(*slot, hold)
            started = time.perf_counter()
            if self._closed():
                self._budget.release(held)
            else:
                self._budget.keep(slot, entry, len(entry.mini.data), held)
            self._counts.add(store_s=time.perf_counter() - started)
            return entry

        def joined(made: bool) -> None:
            self._counts.add(**{"misses" if made else "shared_fetches": 1})

        entry, made = self._inflight.get(slot, fetch, joined)
        return entry, "fetched" if made else "joined"

    def _fetch(self, ep: int, key: str, hold: Hold | None) -> tuple[Entry, Hold]:
        """The episode's bytes read and wrapped, and what holds them: `hold`, else a hold taken now for them.

        A hold taken here is let go of if the fetch fails. Read with a
        sidecar's index of a file that has changed since, it is read again
        with the file's index as it is now (episodes._indexes).
        """
        record = self._files.record(ep, key)
        url = self._storage.url(record.videos[key].path)
        while True:
            t0 = time.perf_counter()
            try:
                at = self._files.span(record, key)
            except EpisodeDataError as exc:
                raise reworded(exc, url, f"episode {ep}, camera {key}") from exc
            t1 = time.perf_counter()
            held = self._budget.hold_now(at.span.num_bytes) if hold is None else hold
            try:
                (read,) = self._storage.start_ranges([(record.videos[key].path, at.span.byte_start, at.span.byte_end)])
                answer = read.result()
                if at.claim is not None:
                    at.claim.settle(answer.file)
                t2 = time.perf_counter()
                mini = synthesize_mini_mp4(at.index, at.span, answer.data)
                t3 = time.perf_counter()
                break
            except BaseException as exc:
                if hold is None:
                    self._budget.release(held)
                if isinstance(exc, EpisodeDataError):
                    raise reworded(exc, url, f"episode {ep}, camera {key}") from exc
                if not isinstance(exc, StaleIndex):
                    raise
        payload = answer.data
        useful = int(at.index.size[np.asarray(at.span.frames)].sum())
        self._counts.add(bytes_fetched=len(payload), bytes_planned=len(payload), bytes_useful=useful,
                         range_requests=1, lookup_s=t1 - t0, fetch_s=t2 - t1, synthesize_s=t3 - t2)
        return Entry(mini, len(payload), _Cost(len(payload), t1 - t0, t2 - t1, t3 - t2)), held
