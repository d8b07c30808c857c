"""The queue between two steps of the local engine: a ring of bytes in shared memory, with a semaphore as its doorbell.

A pipe costs a hop four system calls (the producer polls for room and
writes; the consumer polls and reads a header, then the body) and the
Python of multiprocessing's connection around each.  Here a message is
copied into shared memory under a lock, and a consumer copies it out under
another: a backlogged consumer takes each message without entering the
kernel at all, and an idle one sleeps on a semaphore that each put posts,
woken as a pipe's write would wake it.

What the ring holds is said by two words in shared memory: the producers'
(messages ever put and where the next goes) and the consumers' (messages
ever taken and where the next is read), each packed into one 64-bit word
and changed by one store.  A message's bytes are written first and then
the producers' word moves past it; a consumer copies a message out and
then moves the consumers' word past it.  So whatever instant a process
dies at, the ring is whole: a producer killed before its store wrote
nothing (its put never returned), one killed after it wrote the message;
a consumer killed before its store took nothing, one killed after it took
that one message with it.  The counts are the words' own, never one behind
their bytes.  The semaphore is only a doorbell: a producer killed before it
rang, or a consumer killed after it was woken, changes no message, since a
sleeping consumer looks at the ring again every RECHECK_S rung or not.  The
count that bounds the queue (`maxsize`) is checked under the write lock, so
no race of producers takes the queue past it.  A message is unpickled after
the read lock is released, so one that cannot be unpickled fails its reader
(UnreadableMessage) and leaves every message behind it in place.

The two locks are robust (rnb.engines.local.robust_lock): a process killed
holding one wedges nobody, as the next to ask takes it over at once (each
such recovery is counted, `recoveries`).  `get(timeout)` gives up at its
deadline whatever the others do, a live holder stopped for good included;
`put_nowait` writes the message or raises (queue.Full at `maxsize`,
QueueClosed once the job ended while it waited for the lock or for room),
never returns without writing.  The two sides read each other's word
without a common lock, relying on stores becoming visible in the order
they were made (x86-64 guarantees it).
"""
from __future__ import annotations

import pickle
import queue
import time
from multiprocessing.context import BaseContext
from typing import Any, Protocol

from rnb.core.termination import POLL_S
from rnb.engines.local.robust_lock import RobustLock

# Bytes of each queue's ring: far more than the signals that can be in flight (each holds one of its producer's
# few slots until it is read), so a producer never waits for room in practice.
RING_BYTES = 1 << 22
# The request ring's room per place of the request queue: in bulk mode the queue holds every request (-v), and a
# request (its payload and a new card) pickles to well under this, so the client never waits for room either.
REQUEST_BYTES = 256
_WORD = 8             # a message is its length in one int64 word, then its pickle, padded to whole words
# An end word: a count of messages (mod 2**30) above a byte position in the ring (below 2**34).  A message takes
# at least two words, so a ring of under 2**34 bytes holds under 2**30 messages and the counts never wrap past
# each other.
_POSITION_BITS = 34
_COUNT_MOD = 1 << (64 - _POSITION_BITS)
MAX_CAPACITY = 1 << _POSITION_BITS
_TAKEN, _PUT = 0, 1   # the ends array: the consumers' word, the producers' word
ROOM_WAIT_S = 0.001   # how often a producer looks for room in a full ring
RECHECK_S = POLL_S    # the longest a waiting consumer sleeps before it looks at the ring again, rung or not
LOCK_WAIT_S = 0.01    # how long past its deadline a get may wait for the read lock: a live holder keeps it for us


class JobFlag(Protocol):
    """The job's termination flag as a queue sees it (rnb.engines.local.plumbing.TerminationFlag)."""

    @property
    def is_set(self) -> bool: ...


class UnreadableMessage(Exception):
    """A message that was taken off a queue but could not be unpickled; the messages behind it are still there."""


class QueueClosed(Exception):
    """The job ended while a put waited for the write lock or for room: the message was not written."""


def _word(count: int, position: int) -> int:
    return (count % _COUNT_MOD) << _POSITION_BITS | position


def _unpacked(word: int) -> tuple[int, int]:
    return word >> _POSITION_BITS, word & (MAX_CAPACITY - 1)


class RingQueue:
    """A multi-producer, multi-consumer queue of pickled messages in shared memory (put_nowait, get).

    `maxsize` messages at most (-qs): a put beyond it raises queue.Full, and
    the caller ends the job.  Producers take the write lock, consumers the
    read lock; the two sides meet only through the ends words and the
    doorbell.  `name` says which queue it is in errors ("the request
    queue"); `advice` ends the sentence refusing a message too large for it.
    """

    def __init__(self, maxsize: int, flag: JobFlag, *, ctx: BaseContext, name: str, capacity: int = RING_BYTES,
                 advice: str = "") -> None:
        if capacity % _WORD or not 0 < capacity < MAX_CAPACITY:
            raise ValueError(f"a ring's capacity must be a multiple of {_WORD} bytes below {MAX_CAPACITY}, not {capacity}")
        self.maxsize = maxsize
        self.capacity = capacity
        self.name = name
        self.advice = advice
        self._flag = flag
        self._ring = ctx.RawArray("B", capacity)
        self._ends = ctx.RawArray("q", 2)
        self._doorbell = ctx.Semaphore(0)
        self._wlock = RobustLock(ctx)
        self._rlock = RobustLock(ctx)
        self._attach()

    def _attach(self) -> None:
        self._bytes = memoryview(self._ring).cast("B")
        self._words = self._bytes.cast("q")
        self._end_words = memoryview(self._ends).cast("B").cast("q")

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in ("_bytes", "_words", "_end_words")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attach()

    def put_nowait(self, obj: Any) -> None:
        """Write `obj` now, or raise: queue.Full when the queue holds `maxsize` messages (never waits for a free
        place), QueueClosed when the job ended while this waited for the write lock or for room."""
        data = self._dumps(obj)
        size = _WORD + -(-len(data) // _WORD) * _WORD
        if size > self.capacity:
            raise ValueError(f"a message of {len(data)} bytes does not fit the {self.capacity}-byte ring of the "
                             f"{self.name}{self.advice}")
        while not self._wlock.acquire(POLL_S):
            if self._flag.is_set:
                raise QueueClosed(f"the job ended before a message could be written to the {self.name}")
        try:
            self._write(data, size)
        finally:
            self._wlock.release()
        self._doorbell.release()

    def _write(self, data: bytes, size: int) -> None:
        """Under the write lock: copy a message in, then publish it and its count with one store."""
        ends = self._end_words
        put, tail = _unpacked(ends[_PUT])
        while True:
            taken, head = _unpacked(ends[_TAKEN])
            held = (put - taken) % _COUNT_MOD
            if held >= self.maxsize:
                raise queue.Full
            used = (tail - head) % self.capacity or (self.capacity if held else 0)
            if self.capacity - used >= size:
                break
            if self._flag.is_set:
                raise QueueClosed(f"the job ended before a message could be written to the {self.name}")
            time.sleep(ROOM_WAIT_S)
        self._store(tail, data)
        ends[_PUT] = _word(put + 1, (tail + size) % self.capacity)  # the message is whole before the word shows it

    def get(self, timeout: float) -> Any:
        """The next message, waiting up to `timeout` seconds for one; queue.Empty if none came.

        Whatever other processes do, it returns within `timeout` plus
        LOCK_WAIT_S.  UnreadableMessage if the next message does not
        unpickle: it is gone from the queue, and the next get reads the one
        behind it.
        """
        rung = False
        deadline = time.monotonic() + timeout
        while (data := self._take(rung, deadline)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise queue.Empty
            rung = self._doorbell.acquire(timeout=min(left, RECHECK_S))
        try:
            return pickle.loads(data)
        except Exception as error:  # the class's own code runs here (a constructor that refuses its pickled args)
            raise UnreadableMessage(f"a message on the {self.name} could not be unpickled "
                                    f"({type(error).__name__}: {error})") from error

    def waiting(self) -> int:
        """How many messages the queue holds now, read without a lock (a reader sees a count a moment old).

        The consumers' word is read first: the producers' read after it can only be as far on or further.
        """
        taken = self._end_words[_TAKEN] >> _POSITION_BITS
        return ((self._end_words[_PUT] >> _POSITION_BITS) - taken) % _COUNT_MOD

    def get_nowait(self) -> Any:
        return self.get(0.0)

    @property
    def recoveries(self) -> int:
        """How many times a process took one of the ring's locks from a process that had died holding it."""
        return self._wlock.recovered + self._rlock.recovered

    def _take(self, rung: bool, deadline: float) -> bytes | None:
        """Under the read lock: a copy of the next message, its place given back; None if the ring is empty or the
        read lock stayed held until the deadline (plus LOCK_WAIT_S).

        A consumer that was not woken by the doorbell silences one ring of
        it, so that rings stay about as many as messages.
        """
        if not self._rlock.acquire(max(deadline - time.monotonic(), 0.0) + LOCK_WAIT_S):
            return None
        try:
            ends = self._end_words
            taken, head = _unpacked(ends[_TAKEN])
            if taken == ends[_PUT] >> _POSITION_BITS:
                return None
            length = self._words[head // _WORD]
            data = self._load((head + _WORD) % self.capacity, length)
            ends[_TAKEN] = _word(taken + 1, (head + _WORD + -(-length // _WORD) * _WORD) % self.capacity)
        finally:
            self._rlock.release()
        if not rung:
            self._doorbell.acquire(False)
        return data

    def _store(self, tail: int, data: bytes) -> None:
        self._words[tail // _WORD] = len(data)
        at = (tail + _WORD) % self.capacity
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
