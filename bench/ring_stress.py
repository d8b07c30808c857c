"""The local engine's ring queue under fire: producers and consumers SIGKILLed at random, lock holders above all.

    .venv/bin/python bench/ring_stress.py [--seconds S]      (bench/faults.py --only ring runs it as a row)

Four producers put numbered messages on one small ring (it wraps every few
hundred messages) and two consumers take them, each process started afresh
when it is killed.  The bench's own process looks at the ring's two locks
all the time and SIGKILLs whoever holds one (the kernel keeps the owner's
thread id in the lock's word), now and then any producer or consumer
instead, and now and then SIGSTOPs the read lock's holder for half a
second before letting it go on, a holder that is alive but never lets go.

A producer notes a message acknowledged once `put_nowait` returned; a
consumer notes each message it got, in shared memory, before anything
else.  At the end the ring is drained.  The promise: nothing acknowledged is
lost but the one message a consumer killed after taking it had in hand (at
most one per consumer killed), nothing is read twice, nothing acknowledged
stays stranded in the ring, and no `get(timeout)` returns later than its
timeout by more than GET_OVERRUN_BOUND_S.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from typing import Any

import numpy as np

from rnb.engines.local.ring import QueueClosed, RingQueue

CTX: SpawnContext = mp.get_context("spawn")
PRODUCERS, CONSUMERS = 4, 2
PER_LIFE = 8192                # messages one producer's life puts at most; then it ends and a new one starts
LIVES = 4096                   # producer lives the bench can count (kills and natural ends)
GET_TIMEOUT_S = 0.05
# How late a get may return: the ring's own LOCK_WAIT_S (10 ms) plus a loaded machine's scheduling delays.
GET_OVERRUN_BOUND_S = 0.25
KILL_EVERY_S = 0.2             # about five kills a second
STOP_S = 0.5                   # how long a stopped read-lock holder stays stopped


class Flag:
    """The job's flag as the ring reads it, in shared memory; raised to end the producers.  (The job's own,
    TerminationFlag, would bring torch into every child: this bench's and tests/engines/test_ring.py's start in well under
    a second.)"""

    def __init__(self) -> None:
        self._value = CTX.RawValue("b", 0)

    @property
    def is_set(self) -> bool:
        return bool(self._value.value)

    def raise_(self) -> None:
        self._value.value = 1


@dataclass
class Shared:
    """What every process of the bench writes, in shared memory."""

    acked: Any      # per producer life: how many of its messages put_nowait returned for
    seen: Any       # per (life, number): how many times a consumer got the message
    overrun: Any    # per consumer slot: the latest a get raised queue.Empty past its timeout, in seconds
    stopped: Any    # per consumer slot: set while the bench stops it (its own lateness is then not the ring's)
    done: Any       # consumers stop once set and the ring is empty

    @staticmethod
    def make() -> Shared:
        return Shared(CTX.RawArray("i", LIVES), CTX.RawArray("B", LIVES * PER_LIFE), CTX.RawArray("d", CONSUMERS),
                      CTX.RawArray("b", CONSUMERS), CTX.Event())


def produce(ring: RingQueue, shared: Shared, life: int) -> None:
    for number in range(PER_LIFE):
        while True:
            try:
                ring.put_nowait((life, number))
                break
            except queue.Full:
                time.sleep(0.001)
            except QueueClosed:
                return
        shared.acked[life] = number + 1


def consume(ring: RingQueue, shared: Shared, slot: int) -> None:
    while True:
        began = time.monotonic()
        try:
            life, number = ring.get(timeout=GET_TIMEOUT_S)
        except queue.Empty:
            if shared.stopped[slot]:
                shared.stopped[slot] = 0
            else:
                shared.overrun[slot] = max(shared.overrun[slot], time.monotonic() - began - GET_TIMEOUT_S)
            if shared.done.is_set():
                return
            continue
        shared.seen[life * PER_LIFE + number] += 1


@dataclass(frozen=True)
class StressResult:
    """What one run of the bench counted."""

    seconds: float
    kills: int
    holder_kills: int
    consumer_kills: int
    stops: int
    acknowledged: int
    lost: int
    stranded: int
    duplicated: int
    worst_overrun_s: float
    recoveries: int

    @property
    def kills_per_minute(self) -> float:
        return self.kills / self.seconds * 60

    @property
    def passed(self) -> bool:
        return (self.lost <= self.consumer_kills and self.stranded == 0 and self.duplicated == 0
                and self.worst_overrun_s <= GET_OVERRUN_BOUND_S)


class Bench:
    """The processes of one run: whom to start again, whom to kill."""

    def __init__(self, seed: int) -> None:
        self.flag = Flag()
        self.ring = RingQueue(64, self.flag, ctx=CTX, name="stress ring", capacity=4096)
        self.shared = Shared.make()
        self.rng = random.Random(seed)
        self.lives = 0
        self.producers: list[Any] = [None] * PRODUCERS
        self.consumers: list[Any] = [None] * CONSUMERS
        self.kills = self.holder_kills = self.consumer_kills = self.stops = 0

    def start_missing(self) -> None:
        for index, process in enumerate(self.producers):
            if (process is None or not process.is_alive()) and self.lives < LIVES:
                self.producers[index] = self._start(produce, self.lives)
                self.lives += 1
        for slot, process in enumerate(self.consumers):
            if process is None or not process.is_alive():
                self.consumers[slot] = self._start(consume, slot)

    def _start(self, target: Any, number: int) -> Any:
        process = CTX.Process(target=target, args=(self.ring, self.shared, number), daemon=True)
        process.start()
        return process

    def strike(self, until: float) -> None:
        """Wait for a lock holder (up to `until`) and SIGKILL it; or, one time in five, kill anyone, or stop a reader."""
        pids = {p.pid: p for p in [*self.producers, *self.consumers] if p is not None and p.is_alive()}
        choice = self.rng.random()
        if choice < 0.1:
            self._stop_reader(pids, until)
            return
        if choice < 0.2:
            self._kill(self.rng.choice(list(pids)), holder=False)
            return
        lock = self.ring._rlock if self.rng.random() < 0.5 else self.ring._wlock
        while time.monotonic() < until:
            holder = lock.holder()
            if holder is not None and holder in pids:
                self._kill(holder, holder=True)
                return

    def _kill(self, pid: int, holder: bool) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills += 1
        self.holder_kills += holder
        self.consumer_kills += pid in {p.pid for p in self.consumers if p is not None}

    def _stop_reader(self, pids: dict[int, Any], until: float) -> None:
        slots = {p.pid: slot for slot, p in enumerate(self.consumers) if p is not None}
        while time.monotonic() < until:
            holder = self.ring._rlock.holder()
            if holder is not None and holder in pids and holder in slots:
                self.shared.stopped[slots[holder]] = 1
                os.kill(holder, signal.SIGSTOP)
                time.sleep(STOP_S)
                os.kill(holder, signal.SIGCONT)
                self.stops += 1
                return

    def finish(self, seconds: float) -> StressResult:
        """Let the producers end, the consumers empty the ring, then count."""
        self.flag.raise_()
        for process in self.producers:
            if process is not None:
                process.join(30)
        self.shared.done.set()
        for process in self.consumers:
            if process is not None:
                process.join(30)
        while True:
            try:
                life, number = self.ring.get_nowait()
            except queue.Empty:
                break
            self.shared.seen[life * PER_LIFE + number] += 1
        acked = list(self.shared.acked)
        seen = np.frombuffer(self.shared.seen, dtype=np.uint8).reshape(LIVES, PER_LIFE)
        lost = sum(int((seen[life, :count] == 0).sum()) for life, count in enumerate(acked))
        return StressResult(seconds, self.kills, self.holder_kills, self.consumer_kills, self.stops, sum(acked), lost,
                            self.ring.waiting(), int((seen > 1).sum()), max(self.shared.overrun), self.ring.recoveries)


def run(seconds: float, seed: int = 0) -> StressResult:
    bench = Bench(seed)
    began = time.monotonic()
    try:
        while (now := time.monotonic()) < began + seconds:
            bench.start_missing()
            bench.strike(min(now + KILL_EVERY_S, began + seconds))
            time.sleep(max(0.0, KILL_EVERY_S - (time.monotonic() - now)))
        return bench.finish(time.monotonic() - began)
    finally:
        for process in mp.active_children():
            process.kill()


def table(results: list[StressResult], header: bool = True) -> str:
    lines = ["| id | what | s | kills/min | kills aimed at a lock's holder | consumers killed | holders stopped | acknowledged | "
             f"lost | stranded | duplicated | worst get overrun s (bound {GET_OVERRUN_BOUND_S:g}) | locks taken from the dead | "
             "passed |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] if header else []
    for r in results:
        lines.append(f"| ring-stress | {PRODUCERS} producers, {CONSUMERS} consumers on a 4 KiB ring, lock holders "
                     f"SIGKILLed | {r.seconds:.0f} | {r.kills_per_minute:.0f} | {r.holder_kills} | {r.consumer_kills} | "
                     f"{r.stops} | {r.acknowledged:,} | {r.lost} | {r.stranded} | {r.duplicated} | "
                     f"{r.worst_overrun_s:.3f} | {r.recoveries} | {'yes' if r.passed else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to keep killing (default 60)")
    args = parser.parse_args(argv)
    result = run(args.seconds)
    print(table([result]))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
