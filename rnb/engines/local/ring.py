"""The queue between two steps of the local engine: a ring of bytes in shared memory, with a semaphore as its doorbell.

A pipe costs a hop four system calls (the producer polls for room and
writes; the consumer polls and reads a header, then the body) and the
Python of multiprocessing's connection around each.  Here a message is
copied into shared memory under a lock, and a consumer copies it out under
another: a backlogged consumer takes each message without entering the
kernel at all, and an idle one sleeps on a semaphore that each put posts,
woken as a pipe's write would wake it.

The ring's bytes between its head and its tail are what it holds; the
semaphore is only a doorbell.  A producer killed after its message is in
but before it rang, or a consumer killed after it was woken but before it
took anything, changes no message: a sleeping consumer looks at the ring
again every RECHECK_S even when nobody rang, and one woken for nothing
goes back to sleep.  The message count that bounds the queue (`maxsize`)
is kept beside the ends and checked under the write lock, so no race of
producers takes the queue past it.  A message is taken off (the head moved)
under the read lock and unpickled after it is released, so one that cannot
be unpickled fails its reader (UnreadableMessage) and leaves every message
behind it in place.

No process waits for good on another: the locks are taken a poll interval
at a time and given up once the job has ended, so a process killed while
holding one (mid-write) holds nobody up past the job's end, which its death
brings about (the main process raises the flag).  A message becomes visible
only once it is written whole: a writer killed mid-message leaves nothing
half written to read.  The two sides read each other's end words without a
common lock, relying on stores becoming visible in the order they were
made (x86-64 guarantees it), as the producer's room check always has.
"""
from __future__ import annotations

import pickle
import queue
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any, Protocol

from rnb.core.termination import POLL_S

# Bytes of each queue's ring: far more than the signals that can be in flight (each holds one of its producer's
# few slots until it is read), so a producer never waits for room in practice.
RING_BYTES = 1 << 22
# The request ring's room per place of the request queue: in bulk mode the queue holds every request (-v), and a
# request (its payload and a new card) pickles to well under this, so the client never waits for room either.
REQUEST_BYTES = 256
_WORD = 8             # a message is its length in one int64 word, then its pickle, padded to whole words
# The ends array: bytes ever taken and ever written (head, tail), messages ever taken and ever written.
_HEAD, _TAIL, _TAKEN, _PUT = 0, 1, 2, 3
ROOM_WAIT_S = 0.001   # how often a producer looks for room in a full ring
RECHECK_S = POLL_S    # the longest a waiting consumer sleeps before it looks at the ring again, rung or not


class JobFlag(Protocol):
    """The job's termination flag as a queue sees it (rnb.engines.local.plumbing.TerminationFlag)."""

    @property
    def is_set(self) -> bool: ...


class UnreadableMessage(Exception):
    """A message that was taken off a queue but could not be unpickled; the messages behind it are still there."""


class RingQueue:
    """A multi-producer, multi-consumer queue of pickled messages in shared memory (put_nowait, get).

    `maxsize` messages at most (-qs): a put beyond it raises queue.Full, and
    the caller ends the job.  Producers take the write lock, consumers the
    read lock; the two sides meet only through the ends array and the
    doorbell.  `name` says which queue it is in errors ("the request
    queue"); `advice` ends the sentence refusing a message too large for it.
    """

    def __init__(self, maxsize: int, flag: JobFlag, *, ctx: BaseContext, name: str, capacity: int = RING_BYTES,
                 advice: str = "") -> None:
        if capacity % _WORD:
            raise ValueError(f"a ring's capacity must be a multiple of {_WORD} bytes, not {capacity}")
        self.maxsize = maxsize
        self.capacity = capacity
        self.name = name
        self.advice = advice
        self._flag = flag
        self._ring = ctx.RawArray("B", capacity)
        self._ends = ctx.RawArray("q", 4)
        self._doorbell = ctx.Semaphore(0)
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
            raise ValueError(f"a message of {len(data)} bytes does not fit the {self.capacity}-byte ring of the "
                             f"{self.name}{self.advice}")
        if not (self._wlock.acquire(False) or self._until(lambda: bool(self._wlock.acquire(timeout=POLL_S)))):
            return
        try:
            written = self._write(data, size)
        finally:
            self._wlock.release()
        if written:
            self._doorbell.release()

    def _write(self, data: bytes, size: int) -> bool:
        """Under the write lock: copy a message in and move the tail past it; False if the job ended first."""
        ends = self._ends
        if ends[_PUT] - ends[_TAKEN] >= self.maxsize:
            raise queue.Full
        tail = ends[_TAIL]
        while self.capacity - (tail - ends[_HEAD]) < size:
            if self._flag.is_set:
                return False
            time.sleep(ROOM_WAIT_S)
        self._store(tail, data)
        ends[_PUT] += 1
        ends[_TAIL] = tail + size  # the message is whole before the tail shows it
        return True

    def get(self, timeout: float) -> Any:
        """The next message, waiting up to `timeout` seconds for one; queue.Empty if none came (or the job ended).

        UnreadableMessage if the next message does not unpickle: it is gone
        from the queue, and the next get reads the one behind it.
        """
        rung = False
        deadline = 0.0
        while (data := self._take(rung)) is None:
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout
            if now >= deadline:
                raise queue.Empty
            rung = self._doorbell.acquire(timeout=min(deadline - now, RECHECK_S))
        try:
            return pickle.loads(data)
        except Exception as error:  # the class's own code runs here (a constructor that refuses its pickled args)
            raise UnreadableMessage(f"a message on the {self.name} could not be unpickled "
                                    f"({type(error).__name__}: {error})") from error

    def waiting(self) -> int:
        """How many messages the queue holds now, read without a lock (a reader sees a count a moment old)."""
        ends = self._ends
        return int(ends[_PUT] - ends[_TAKEN])

    def get_nowait(self) -> Any:
        return self.get(0.0)

    def _take(self, rung: bool) -> bytes | None:
        """Under the read lock: a copy of the next message, its place given back; None if the ring is empty.

        A consumer that was not woken by the doorbell silences one ring of
        it, so that rings stay about as many as messages.
        """
        if not (self._rlock.acquire(False) or self._until(lambda: bool(self._rlock.acquire(timeout=POLL_S)))):
            raise queue.Empty  # a consumer killed while reading holds the lock for good; the job is ending anyway
        try:
            ends = self._ends
            head = ends[_HEAD]
            if head == ends[_TAIL]:
                return None
            start = head % self.capacity
            length = self._words[start // _WORD]
            data = self._load((start + _WORD) % self.capacity, length)
            ends[_TAKEN] += 1
            ends[_HEAD] = head + _WORD + -(-length // _WORD) * _WORD
        finally:
            self._rlock.release()
        if not rung:
            self._doorbell.acquire(False)
        return data

    def _store(self, tail: int, data: bytes) -> None:
        start = tail % self.capacity
        self._words[start // _WORD] = len(data)
        at = (start + _WORD) % self.capacity
        first = min(len(data), self.capacity - at)
        self._bytes[at: at + first] = data[:first]
        if first < len(data):  # the message wraps around the ring's end
            self._bytes[: len(data) - first] = data[first:]

    def _load(self, at: int, length: int) -> bytes:
        first = min(length, self.capacity - at)
        if first == length:
            return self._bytes[at: at + length].tobytes()
        return self._bytes[at:].tobytes() + self._bytes[: length - first].tobytes()

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
