"""The ring queue loses nothing, whatever dies where: each kill point reproduced on the real ring.

Producers and consumers are children started as a job's are (forked from
the fork server, rnb.engines.local.lifeline) and SIGKILLed at the exact point
under test.  The point is reached by replacing, in the doomed process only,
the ring's doorbell with one that kills its process (`DiesRinging`,
`DiesWoken`): the shipped code runs unchanged up to that instant.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.ring_stress import Flag
from rnb.engines.local.lifeline import children_context
from rnb.engines.local.ring import QueueClosed, RingQueue, UnreadableMessage

CTX = children_context()
JOIN_S = 120.0  # a hang guard for the children: they may take long to start on a loaded machine
PER_PRODUCER = 3000  # messages each producer of the six-process test puts


class DiesRinging:
    """A producer's doorbell that SIGKILLs its process instead of ringing: after the message is in, before the post."""

    def __init__(self, bell: Any) -> None:
        self.bell = bell

    def __getattr__(self, name: str) -> Any:  # the bell's other calls, as they were
        return getattr(self.bell, name)

    def release(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class DiesWoken:
    """A consumer's doorbell that sleeps until rung (whatever the wait asked), then SIGKILLs its process.

    The consumer dies holding the ring of a message it never took: after the
    wake-up, before the read lock.  `asleep` is set as it starts to sleep.
    """

    def __init__(self, bell: Any, asleep: Any) -> None:
        self.bell = bell
        self.asleep = asleep

    def __getattr__(self, name: str) -> Any:  # the bell's other calls, as they were
        return getattr(self.bell, name)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if not block:
            return bool(self.bell.acquire(False))
        self.asleep.set()
        if self.bell.acquire(timeout=JOIN_S):
            os.kill(os.getpid(), signal.SIGKILL)
        return False


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DiesReleasing:
    """A lock that SIGKILLs its process instead of releasing: the holder dies with everything it did published."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, timeout: float = 0.0) -> bool:
        return bool(self.lock.acquire(timeout))

    def release(self) -> None:
        _sigkill_self()


def _then_killed(step: Any) -> Any:
    """`step` (a ring's copy in or out) done, then its process SIGKILLed: it dies holding the lock, before the store
    that would publish what it did."""
    def dying(*args: Any) -> Any:
        step(*args)
        _sigkill_self()
    return dying


def _put_holding(ring: RingQueue, message: Any, point: str) -> None:
    """Put `message`, dying holding the write lock `point`: "copied" (before publishing) or "published"."""
    if point == "copied":
        ring._store = _then_killed(ring._store)  # type: ignore[method-assign]
    else:
        ring._wlock = DiesReleasing(ring._wlock)  # type: ignore[assignment]
    ring.put_nowait(message)


def _get_holding(ring: RingQueue, point: str) -> None:
    """Get, dying holding the read lock `point`: "copied" (before taking the message off) or "taken"."""
    if point == "copied":
        ring._load = _then_killed(ring._load)  # type: ignore[method-assign]
    else:
        ring._rlock = DiesReleasing(ring._rlock)  # type: ignore[assignment]
    ring.get(timeout=JOIN_S)


def _hold_lock(ring: RingQueue, which: str, holding: Any) -> None:
    """Take one of the ring's locks and keep it, alive, until killed."""
    assert getattr(ring, which).acquire(JOIN_S)
    holding.set()
    time.sleep(JOIN_S)


def _put_dying_at(ring: RingQueue, messages: list[Any], dies_at: int) -> None:
    for index, message in enumerate(messages):
        if index == dies_at:
            ring._doorbell = DiesRinging(ring._doorbell)
        ring.put_nowait(message)


def _get_dying_woken(ring: RingQueue, asleep: Any) -> None:
    ring._doorbell = DiesWoken(ring._doorbell, asleep)
    ring.get(timeout=JOIN_S)


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    """Kill what a failed test left running: a child still mapping a ring would write into the next test's memory."""
    yield
    for child in mp.active_children():
        child.kill()
        child.join(JOIN_S)


def _killed(process: Any) -> int | None:
    process.join(JOIN_S)
    return process.exitcode


def drained(ring: RingQueue) -> list[Any]:
    """Every message left on the ring, in order, without waiting for more."""
    messages = []
    while True:
        try:
            messages.append(ring.get_nowait())
        except queue.Empty:
            return messages


def test_a_producer_killed_between_writing_and_ringing_loses_nothing_and_leaves_nobody_behind():
    ring = RingQueue(100, Flag(), ctx=CTX, name="test queue")
    producer = CTX.Process(target=_put_dying_at, args=(ring, ["a", "b", "c", "d"], 2))
    producer.start()
    assert _killed(producer) == -signal.SIGKILL
    # "c" is in the ring with nobody told: a consumer that waits is woken by its own look at the ring.
    assert [ring.get(timeout=JOIN_S) for _ in range(3)] == ["a", "b", "c"]
    with pytest.raises(queue.Empty):
        ring.get(timeout=0.2)
    ring.put_nowait("e")
    assert ring.get(timeout=JOIN_S) == "e"  # the next message is read as itself, not one behind
    assert drained(ring) == []


def test_a_consumer_killed_between_its_wake_up_and_the_read_lock_leaves_the_message_for_the_others():
    ring = RingQueue(100, Flag(), ctx=CTX, name="test queue")
    asleep = CTX.Event()
    consumer = CTX.Process(target=_get_dying_woken, args=(ring, asleep))
    consumer.start()
    assert asleep.wait(JOIN_S)
    ring.put_nowait("a")  # its ring wakes the consumer, which dies without taking "a"
    assert _killed(consumer) == -signal.SIGKILL
    assert ring.get(timeout=JOIN_S) == "a"
    ring.put_nowait("b")
    assert ring.get(timeout=JOIN_S) == "b"
    assert drained(ring) == []


def test_producers_killed_before_ringing_cannot_take_the_queue_past_maxsize():
    ring = RingQueue(2, Flag(), ctx=CTX, name="test queue")
    producers = [CTX.Process(target=_put_dying_at, args=(ring, [name], 0)) for name in ("a", "b")]
    for producer in producers:
        producer.start()
    assert [_killed(producer) for producer in producers] == [-signal.SIGKILL] * 2
    with pytest.raises(queue.Full):  # two messages are in, neither rung: the count is the ring's, not the bell's
        ring.put_nowait("c")
    assert sorted(drained(ring)) == ["a", "b"]
    ring.put_nowait("c"), ring.put_nowait("d")
    with pytest.raises(queue.Full):
        ring.put_nowait("e")
    assert drained(ring) == ["c", "d"]


class TwoPartError(Exception):
    """Pickles (as its class and one message) but cannot be rebuilt: its __init__ wants two arguments."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def test_a_message_that_does_not_unpickle_fails_its_reader_once_and_keeps_the_messages_behind_it():
    ring = RingQueue(100, Flag(), ctx=CTX, name="inter-step queue 0 (step 0 to step 1)")
    for message in ["a", TwoPartError("decoding", "cut short"), "b", "c"]:
        ring.put_nowait(message)
    assert ring.get(timeout=1) == "a"
    with pytest.raises(UnreadableMessage) as raised:
        ring.get(timeout=1)
    assert str(raised.value) == ("a message on the inter-step queue 0 (step 0 to step 1) could not be unpickled "
                                 "(TypeError: TwoPartError.__init__() missing 1 required positional argument: 'why')")
    assert drained(ring) == ["b", "c"]


def _consume(ring: RingQueue, done: Any, counts: Any, disorder: Any) -> None:
    """Count each message taken (by its number) until `done` and the ring is empty; note any out of order."""
    last: dict[int, int] = {}
    while True:
        try:
            producer, index = ring.get(timeout=0.1)
        except queue.Empty:
            if done.is_set():
                return
            continue
        counts[producer * PER_PRODUCER + index] += 1
        if index <= last.get(producer, -1):
            disorder.value += 1
        last[producer] = index


def _produce(ring: RingQueue, producer: int, dies_at: int | None) -> None:
    for index in range(PER_PRODUCER):
        if index == dies_at:
            ring._doorbell = DiesRinging(ring._doorbell)
        while True:
            try:
                ring.put_nowait((producer, index))
                break
            except queue.Full:
                time.sleep(0.001)



def test_three_producers_and_three_consumers_lose_nothing_when_one_of_each_dies_at_its_kill_point():
    """Producer 0 dies after writing its message 1000, before ringing; consumer 0 dies woken, before reading."""
    ring = RingQueue(64, Flag(), ctx=CTX, name="test queue", capacity=4096)  # small: the ring wraps some 55 times
    counts = CTX.RawArray("i", 3 * PER_PRODUCER)
    disorder = CTX.RawValue("i", 0)
    done, asleep = CTX.Event(), CTX.Event()
    doomed = CTX.Process(target=_get_dying_woken, args=(ring, asleep))
    doomed.start()
    assert asleep.wait(JOIN_S)
    producers = [CTX.Process(target=_produce, args=(ring, p, 1000 if p == 0 else None)) for p in range(3)]
    for process in producers:
        process.start()
    # The first ring wakes the doomed consumer, the only one: a consumer started with it could take the rings
    # it sleeps on for as long as the producers put (a semaphore hands a ring to whoever asks first).
    assert _killed(doomed) == -signal.SIGKILL
    consumers = [CTX.Process(target=_consume, args=(ring, done, counts, disorder)) for _ in range(2)]
    for process in consumers:
        process.start()
    assert [_killed(producer) for producer in producers] == [-signal.SIGKILL, 0, 0]
    done.set()
    assert [_killed(consumer) for consumer in consumers] == [0, 0]
    expected = [1] * 1001 + [0] * (PER_PRODUCER - 1001) + [1] * (2 * PER_PRODUCER)
    assert (list(counts), disorder.value, drained(ring)) == (expected, 0, [])



@pytest.mark.parametrize(("point", "in_ring"), [("copied", []), ("published", ["b"])])
def test_a_producer_killed_holding_the_write_lock_wedges_nobody_and_leaves_the_ring_whole(point: str, in_ring: list):
    """Killed after copying its message in but before publishing it, the producer wrote nothing; killed after
    publishing, before releasing the lock, it wrote its message whole.  Either way the next put takes the lock over."""
    ring = RingQueue(100, Flag(), ctx=CTX, name="test queue")
    ring.put_nowait("a")
    producer = CTX.Process(target=_put_holding, args=(ring, "b", point))
    producer.start()
    assert _killed(producer) == -signal.SIGKILL
    assert ring.waiting() == 1 + len(in_ring)
    ring.put_nowait("c")
    assert (ring.recoveries, ring.waiting()) == (1, 2 + len(in_ring))
    assert drained(ring) == ["a", *in_ring, "c"]
    assert ring.waiting() == 0


@pytest.mark.parametrize(("point", "left"), [("copied", ["a", "b"]), ("taken", ["b"])])
def test_a_consumer_killed_holding_the_read_lock_takes_at_most_its_message_with_it(point: str, left: list):
    """Killed after copying a message out but before taking it off, the consumer took nothing; killed after taking it
    off, before releasing the lock, it took that one message with it.  The others read on at once, in order."""
    ring = RingQueue(100, Flag(), ctx=CTX, name="test queue")
    ring.put_nowait("a"), ring.put_nowait("b")
    consumer = CTX.Process(target=_get_holding, args=(ring, point))
    consumer.start()
    assert _killed(consumer) == -signal.SIGKILL
    assert ring.waiting() == len(left)
    assert drained(ring) == left
    assert (ring.recoveries, ring.waiting()) == (1, 0)
    ring.put_nowait("c")
    assert drained(ring) == ["c"]


def test_a_live_lock_holder_that_never_lets_go_cannot_make_get_wait_past_its_timeout_nor_put_return_unwritten():
    flag = Flag()
    ring = RingQueue(100, flag, ctx=CTX, name="test queue")
    ring.put_nowait("a")
    holders = {which: (CTX.Event(), which) for which in ("_rlock", "_wlock")}
    processes = [CTX.Process(target=_hold_lock, args=(ring, which, holding)) for holding, which in holders.values()]
    for process in processes:
        process.start()
    assert all(holding.wait(JOIN_S) for holding, _ in holders.values())
    with pytest.raises(queue.Empty):   # "a" is there, behind a read lock held for good
        ring.get(timeout=0.2)
    flag.raise_()
    with pytest.raises(QueueClosed, match="the job ended before a message could be written to the test queue"):
        ring.put_nowait("b")
    for process in processes:
        process.kill()
        process.join(JOIN_S)
    assert (drained(ring), ring.recoveries) == (["a"], 1)   # the dead reader's lock taken over; the writer's not asked


def test_a_put_that_waits_for_room_when_the_job_ends_raises_rather_than_drop_its_message():
    flag = Flag()
    ring = RingQueue(100, flag, ctx=CTX, name="test queue", capacity=64)
    ring.put_nowait("x" * 40)   # 8 + 56 bytes: the ring is full
    flag.raise_()
    with pytest.raises(QueueClosed):
        ring.put_nowait("y")
    assert drained(ring) == ["x" * 40]
