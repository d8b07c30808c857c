"""The queue between two steps of the local engine: a ring of bytes in shared memory, with a semaphore as its doorbell.

A pipe costs a hop four system calls (the producer polls for room and
writes; the consumer polls and reads a header, then the body) and the
Python of multiprocessing's connection around each.  Here a message is
copied into shared memory under a lock, and one semaphore counts the
messages written and not yet taken: its post and its wait stay in user space
(a futex) unless the consumer is asleep, so a backlogged consumer takes each
message without entering the kernel at all, and an idle one is woken by the
post as a pipe's write would wake it.

No process waits for good on another: the locks are taken a poll interval
at a time and given up once the job has ended, so a process killed while
holding one (mid-write) holds nobody up past the job's end, which its death
brings about (the main process raises the flag).  A message becomes visible
only once it is written whole: a writer killed mid-message leaves nothing
half written to read.
"""
from __future__ import annotations

import pickle
import queue
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext
from typing import Any, Protocol

from rnb.core.termination import POLL_S

# Bytes of each queue's ring: far more than the signals that can be in flight (each holds one of its producer's
# few slots until it is read), so a producer never waits for room in practice.
RING_BYTES = 1 << 22
# The request ring's room per place of the request queue: in bulk mode the queue holds every request (-v), and a
# request (its payload and a new card) pickles to well under this, so the client never waits for room either.
REQUEST_BYTES = 256
_WORD = 8             # a message is its length in one int64 word, then its pickle, padded to whole words
_HEAD, _TAIL = 0, 1   # bytes ever taken and ever written, in the ends array
ROOM_WAIT_S = 0.001   # how often a producer looks for room in a full ring


class JobFlag(Protocol):
    """The job's termination flag as a queue sees it (rnb.engines.local.plumbing.TerminationFlag)."""

    @property
    def is_set(self) -> bool: ...


class RingQueue:
    """A multi-producer, multi-consumer queue of pickled messages in shared memory (put_nowait, get).

    `maxsize` messages at most (-qs): a put beyond it raises queue.Full, and
    the caller ends the job.  Producers take the write lock, consumers the
    read lock; the two sides meet only through the ends array and the
    semaphore, whose post and wait order the memory each side touched.
    """

    def __init__(self, maxsize: int, flag: JobFlag, *, ctx: SpawnContext, capacity: int = RING_BYTES) -> None:
        if capacity % _WORD:
            raise ValueError(f"a ring's capacity must be a multiple of {_WORD} bytes, not {capacity}")
        self.maxsize = maxsize
        self.capacity = capacity
        self._flag = flag
        self._ring = ctx.RawArray("B", capacity)
        self._ends = ctx.RawArray("q", 2)
        self._items = ctx.Semaphore(0)
        self._wlock = ctx.Lock()
        self._rlock = ctx.Lock()
        self._attach()

    def _attach(self) -> None:
        self._bytes = memoryview(self._ring).cast("B")
        self._words = self._bytes.cast("q")

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in ("_bytes", "_words")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attach()

    def put_nowait(self, obj: Any) -> None:
        """Write `obj` now; queue.Full when the queue holds `maxsize` messages (never waits for a free place).

        A message is dropped, not written, once the job has ended while this
        producer waited for the write lock or for room.
        """
        data = self._dumps(obj)
        size = _WORD + -(-len(data) // _WORD) * _WORD
        if size > self.capacity:
            raise ValueError(f"a message of {len(data)} bytes does not fit the inter-step queue's ring of "
                             f"{self.capacity} bytes; pass less in non_tensors")
        if not (self._wlock.acquire(False) or self._until(lambda: bool(self._wlock.acquire(timeout=POLL_S)))):
            return
        try:
            if self._items.get_value() >= self.maxsize:
                raise queue.Full
            ends = self._ends
            tail = ends[_TAIL]
            while self.capacity - (tail - ends[_HEAD]) < size:
                if self._flag.is_set:
                    return
                time.sleep(ROOM_WAIT_S)
            self._store(tail, data)
            ends[_TAIL] = tail + size
        finally:
            self._wlock.release()
        self._items.release()

    def get(self, timeout: float) -> Any:
        """The next message, waiting up to `timeout` seconds for one; queue.Empty if none came (or the job ended)."""
        if not self._items.acquire(timeout=timeout):
            raise queue.Empty
        if not (self._rlock.acquire(False) or self._until(lambda: bool(self._rlock.acquire(timeout=POLL_S)))):
            raise queue.Empty  # a consumer killed while reading holds the lock for good; the job is ending anyway
        try:
            head = self._ends[_HEAD]
            start = head % self.capacity
            length = self._words[start // _WORD]
            obj = pickle.loads(self._load((start + _WORD) % self.capacity, length))
            self._ends[_HEAD] = head + _WORD + -(-length // _WORD) * _WORD
        finally:
            self._rlock.release()
        return obj

    def get_nowait(self) -> Any:
        return self.get(0.0)

    def _store(self, tail: int, data: bytes) -> None:
        start = tail % self.capacity
        self._words[start // _WORD] = len(data)
        at = (start + _WORD) % self.capacity
        first = min(len(data), self.capacity - at)
        self._bytes[at: at + first] = data[:first]
        if first < len(data):  # the message wraps around the ring's end
            self._bytes[: len(data) - first] = data[first:]

    def _load(self, at: int, length: int) -> bytes | memoryview:
        first = min(length, self.capacity - at)
        if first == length:
            return self._bytes[at: at + length]
        return bytes(self._bytes[at:]) + bytes(self._bytes[: length - first])

    def _dumps(self, obj: Any) -> bytes:
        """`obj` pickled plainly: no reducer table beyond copyreg's, no class named in the hop's wire tuples.

        multiprocessing's ForkingPickler would build a pickler with a fresh
        copy of copyreg's table and its own reducers (torch registers some 80)
        for every message, and share a tensor's memory rather than copy it;
        messages carry no tensors (shared slots do), so a plain pickle does.
        """
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)

    def _until(self, ready: Callable[[], bool]) -> bool:
        """True once `ready()` (which waits up to a poll interval) is; False if the job ended first."""
        while not ready():
            if self._flag.is_set:
                return False
        return True
