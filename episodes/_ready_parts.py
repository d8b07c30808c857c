"""Requests made ready to decode by the fetch threads: each one's mini-MP4 cut and its CPU decoder opened.

Cutting a request's frame-window mini-MP4 and opening a decoder over it
cost about as much as decoding a frame; done on the fetch threads once the
request's reads have landed, they leave its reader only the decoding. An
open decoder holds memory, so at most `room` such parts wait for their
readers at once; requests whose reads land while there is none wait in a
queue, the one whose reader comes first at its head, and the next is made
as soon as a reader is done with its part. A reader that comes to a
request nobody has begun to make makes it itself, rather than wait.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from episodes._decode import open_decoder
from episodes._reads import FetchedFrames
from episodes._windows import JobReads, when_landed, window_mini

if TYPE_CHECKING:
    from torchcodec.decoders import VideoDecoder  # torchcodec is imported where a decoder opens (episodes._decode)


@dataclass(frozen=True, eq=False)
class Part:
    """What can be decoded of a request: its frames in a mini-MP4, and a decoder already open over it, where the
    fetch threads opened one (on the CPU) once its bytes had landed."""

    fetched: FetchedFrames
    decoder: VideoDecoder | None = None


class ReadyPart:
    """A request's whole Part as the fetch threads make it once its reads have all landed, for its reader to take;
    None where they made none (a read failed: the reader then meets the error itself) or its reader came first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made = threading.Event()
        self._part: Part | None = None
        self._state: Literal["waiting", "making", "made", "taken"] = "waiting"

    def begin(self) -> bool:
        """The fetch threads' claim to make it: False where its reader has taken it over already."""
        with self._lock:
            if self._state != "waiting":
                return False
            self._state = "making"
            return True

    def put(self, part: Part | None) -> None:
        with self._lock:
            self._part, self._state = part, "made"
        self._made.set()

    def take(self) -> Part | None:
        """The part (only ever asked once its reads have all landed): waited for while being made, None where
        nobody has begun to make it (the reader makes it) and the second time."""
        with self._lock:
            if self._state == "waiting":
                self._state = "taken"
                return None
        self._made.wait()
        with self._lock:
            part, self._part = self._part, None
        return part


class ReadyParts:
    """Makes requests' parts on `pool`, at most `room` waiting for their readers (see the module)."""

    def __init__(self, pool: Executor, count: Callable[..., None], *, room: int, decode_threads: int) -> None:
        self._pool, self._count, self._decode_threads = pool, count, decode_threads
        self._room = threading.BoundedSemaphore(room)
        self._lock = threading.Lock()
        self._queue: list[tuple[int, JobReads, ReadyPart]] = []
        self._order = itertools.count()

    def later(self, share: JobReads) -> ReadyPart:
        """The share's part, queued once its last read lands, in the order `later` was asked (its readers')."""
        ready, order = ReadyPart(), next(self._order)

        def landed() -> None:
            with self._lock:
                heapq.heappush(self._queue, (order, share, ready))
            self._next()
        when_landed(list(share.reads.values()), landed)
        return ready

    def _next(self) -> None:
        """Begin the first queued part that nobody has begun, if a decoder may be opened for it."""
        if not self._room.acquire(blocking=False):
            return
        with self._lock:
            while self._queue:
                _, share, ready = heapq.heappop(self._queue)
                if ready.begin():
                    break
            else:
                share = None
        if share is None:
            self._room.release()
            return
        try:
            self._pool.submit(self._make, share, ready)
        except RuntimeError:  # the cache is closing: its reader, if any, cuts and opens for itself
            ready.put(None)
            self._room.release()

    def _make(self, share: JobReads, ready: ReadyPart) -> None:
        """Cut the share's whole mini-MP4 and open its CPU decoder; its room is freed once its reader is done."""
        try:
            got = window_mini(share, {start: share.blob(start) for start in share.reads}, share.charged, 0.0)
            started = time.perf_counter()
            part = Part(got, open_decoder(got.mini, "cpu", num_threads=self._decode_threads))
            self._count(decode_s=time.perf_counter() - started)
        except Exception:  # a failed read, cut or stale index is its reader's to meet, as a direct read meets it
            ready.put(None)
            self._freed()
            return
        weakref.finalize(part, self._freed)
        ready.put(part)

    def _freed(self) -> None:
        self._room.release()
        self._next()
