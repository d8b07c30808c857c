"""Fetches in flight: a request's bytes on their way, to be waited for whole or decoded part by part as they land.

`EpisodeByteCache.start_fetch` returns one FetchInFlight per request
without waiting for any byte. `result()` waits for all of its bytes (the
fetch phase, as `fetch_frames` gives it); `parts()` yields what can be
decoded as soon as it can: with fetch="windows", a mini-MP4 of the runs
whose range reads have landed, while later ones are still on the wire.

A fetch started ahead of its reader (a prefetch) may not start at all,
where its bytes would not fit the cache's budget, or be dropped before its
reader comes, to make room for a read asked for now; its reader then
fetches on the spot, and `fetched_ahead` says which happened. A failed
read is raised to the reader that needed it, worded as a direct fetch
words it, and never elsewhere. A read planned with a sidecar's index of a
file that has changed since (episodes._indexes.StaleIndex) is planned and
read again on the spot, before any of its bytes is cut or decoded.
"""
from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

import numpy as np

from episodes._budget import Hold, Holds
from episodes._indexes import StaleIndex
from episodes._mp4 import MiniMp4
from episodes._reads import FetchedFrames
from episodes._ready_parts import Part, ReadyPart
from episodes._windows import JobReads, window_mini


@dataclass(frozen=True, eq=False)
class WindowsStart:
    """A windows job whose range reads have started, the hold on the bytes they bring, and what the fetch threads
    make of them once landed (`ready`, where the reader's device is known to be the CPU)."""

    share: JobReads
    hold: Hold
    ready: ReadyPart | None = None


# What starting one request's fetch gives: its range reads started, or its frames in a kept whole episode
# (nothing to wait for), or None where a fetch ahead did not fit the budget.
Started = WindowsStart | FetchedFrames | None


class FetchInFlight(abc.ABC):
    """One request's fetch, started (see the module). `episode` and `key` name what it reads."""

    def __init__(self, episode: int, key: str) -> None:
        self.episode = episode
        self.key = key
        self.fetched_ahead = False
        """Whether its bytes were fetched ahead of its reader (by a prefetch), known once it is read."""
        self.wait_s = 0.0
        """Seconds its reader waited for bytes so far, in `result` or before and between the parts."""
        self.first_wait_s = 0.0
        """Of those, the seconds waited before the first part could be decoded."""
        self.frame_numbers = np.zeros(0, np.int64)
        """The request's episode frame numbers in the order asked, known once its first part is."""

    @abc.abstractmethod
    def result(self) -> FetchedFrames:
        """Wait for all of its bytes: its frames and the mini-MP4 they decode from, as fetch_frames gives them."""

    def parts(self) -> Iterator[Part]:
        """What can be decoded, as soon as it can be: one Part per piece, their frames the request's once put
        together in order (see EpisodeByteCache.decode_frames). Only the last part's bytes_fetched is not 0."""
        yield Part(self.result())

    @abc.abstractmethod
    def cancel(self) -> None:
        """Nobody will read it: let go of its bytes (a read on the wire still lands, then is dropped)."""


class EpisodeInFlight(FetchInFlight):
    """A whole episode's fetch: started ahead into the kept mini-MP4s, or read on the spot by `fetch_now`."""

    def __init__(self, episode: int, key: str, fetch_now: Callable[[], FetchedFrames],
                 ahead: Future[MiniMp4 | None] | None = None) -> None:
        super().__init__(episode, key)
        self._fetch_now, self._ahead = fetch_now, ahead

    def result(self) -> FetchedFrames:
        began = time.perf_counter()
        got = self._fetch_now()
        self.wait_s += time.perf_counter() - began
        self.first_wait_s = self.wait_s
        self.fetched_ahead, self.frame_numbers = got.fetched_ahead, got.frame_numbers
        return got

    def cancel(self) -> None:
        if self._ahead is not None:
            self._ahead.cancel()


class WindowsInFlight(FetchInFlight):
    """A windows job: planned and its reads started on the cache's threads (`started`), or started again on the
    spot by `again` where a fetch ahead did not fit or was dropped."""

    def __init__(self, episode: int, key: str, started: Future[Started], again: Callable[[], WindowsInFlight],
                 budget: Holds, *, ahead: bool) -> None:
        super().__init__(episode, key)
        self._started, self._again, self._budget, self._ahead = started, again, budget, ahead
        self.cut_s = 0.0
        """Seconds spent cutting its mini-MP4s out of the bytes read (none where its episode was kept)."""

    def _take(self) -> WindowsStart | FetchedFrames:
        """What was started, claimed for this reader; started again now where it did not start or was dropped."""
        began = time.perf_counter()
        started = self._started.result()
        self.wait_s += time.perf_counter() - began
        if isinstance(started, FetchedFrames):
            return started
        if started is None or not self._budget.claim(started.hold):
            return self._take_again()
        self.fetched_ahead = self._ahead
        return started

    def _take_again(self) -> WindowsStart | FetchedFrames:
        """Started again on the spot, planned afresh, and claimed for this reader."""
        again = self._again()
        taken = again._take()
        self.wait_s += again.wait_s
        return taken

    def result(self) -> FetchedFrames:
        taken = self._take()
        while True:
            try:
                return self._whole(taken)
            except StaleIndex:
                taken = self._take_again()

    def _whole(self, taken: WindowsStart | FetchedFrames) -> FetchedFrames:
        """result() of what was taken: its bytes waited for whole, its hold released."""
        if isinstance(taken, FetchedFrames):
            self.first_wait_s, self.frame_numbers = self.wait_s, taken.frame_numbers
            return taken
        share = taken.share
        self.frame_numbers = share.job.numbers
        try:
            began = time.perf_counter()
            blobs = {start: share.blob(start) for start in share.reads}
            self.wait_s += time.perf_counter() - began
            self.first_wait_s = self.wait_s
            got = window_mini(share, blobs, share.charged, self.wait_s)
            self.cut_s += got.synthesize_s
            return got
        finally:
            self._budget.release(taken.hold, share.frees)

    def parts(self) -> Iterator[Part]:
        taken = self._take()
        while True:
            try:
                # A stale index is met at the first bytes a request takes (its file's claim is settled once and
                # for all), so before any part was yielded: the parts come from one attempt only.
                yield from self._parts_of(taken)
                return
            except StaleIndex:
                taken = self._take_again()

    def _parts_of(self, taken: WindowsStart | FetchedFrames) -> Iterator[Part]:
        """parts() of what was taken, its hold released once they are done."""
        if isinstance(taken, FetchedFrames):
            self.first_wait_s, self.frame_numbers = self.wait_s, taken.frame_numbers
            yield Part(taken)
            return
        share, left = taken.share, set(range(len(taken.share.run_reads)))
        self.frame_numbers = share.job.numbers
        try:
            while left:
                began = time.perf_counter()
                wait({share.reads[share.run_reads[k]] for k in left}, return_when=FIRST_COMPLETED)
                ready = sorted(k for k in left if share.reads[share.run_reads[k]].done())
                whole = len(ready) == len(share.run_reads)
                made = taken.ready.take() if whole and taken.ready is not None else None
                blobs = {} if made else {start: share.blob(start) for start in {share.run_reads[k] for k in ready}}
                self.wait_s += time.perf_counter() - began
                if len(left) == len(share.run_reads):
                    self.first_wait_s = self.wait_s
                left -= set(ready)
                if made is not None:
                    self.cut_s += made.fetched.synthesize_s
                    yield Part(dataclasses.replace(made.fetched, fetch_s=self.wait_s), made.decoder)
                    continue
                part = window_mini(share, blobs, 0 if left else share.charged, self.wait_s, None if whole else ready)
                self.cut_s += part.synthesize_s
                yield Part(part)
        finally:
            self._budget.release(taken.hold, share.frees)

    def cancel(self) -> None:
        self._started.add_done_callback(self._let_go)

    def _let_go(self, started: Future[Started]) -> None:
        """Once started, the start's hold released unless its reader or a read asked for now took it."""
        if started.exception() is not None:
            return
        start = started.result()
        if isinstance(start, WindowsStart) and self._budget.claim(start.hold):
            for read in start.share.reads.values():
                read.cancel()
            self._budget.release(start.hold)
