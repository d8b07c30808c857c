"""How items leave a Ray actor: one call per consumer at a time, made off the loop's thread, the rest batched.

An actor call is the whole cost of a hop on Ray: profiled on this project's
2-core machine at load 12-14, a call with a reply cost the calling process
650-700 us of CPU and the called one 750-1,000 us, whatever the actor's kind
(async or threaded) and whether it replied at once, against tens of us for
everything the runner loop does with an item.  Two things follow.

- A producer has at most one call untaken per consumer.  What it hands over
  to that consumer meanwhile waits in its `Outbox` and goes, as one list,
  in the next call, as soon as the one before was taken; a consumer that
  keeps up gets each item at once in a call of its own, a backlogged one
  gets as many as wait (four items in a call cost a third of four calls).
- Every call is made by the actor's `Courier` thread, never by the loop:
  a step that waits on its device (or sleeps) overlaps its calls with its
  next item instead of paying them in line.

So an item must not depend on what the producer does after handing it over:
its message is pickled when it is handed over (`Parcel`) and its tensors are
the producer's own copies.
"""
from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rnb.core.messages import Handoff, Request
from rnb.core.termination import POLL_S

if TYPE_CHECKING:
    import torch

FLUSH_TIMEOUT_S = 5.0   # how long an actor's last words wait for the calls queued before them to be made


@dataclass(frozen=True)
class Parcel:
    """One item in a hand-off call: its message pickled at hand-over, its tensors the producer's copies."""

    message: bytes                      # a pickled Handoff (to a runner) or Request (to step 0)
    tensors: tuple[torch.Tensor, ...] = ()

    @classmethod
    def of(cls, message: Handoff | Request, tensors: tuple[torch.Tensor, ...] = ()) -> Parcel:
        return cls(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), tensors)

    def opened(self) -> Handoff | Request:
        message: Handoff | Request = pickle.loads(self.message)
        return message

    def __reduce__(self) -> tuple[type[Parcel], tuple[bytes, tuple[torch.Tensor, ...]]]:
        return Parcel, (self.message, self.tensors)


class Courier:
    """A thread making an actor's calls in the order they were posted (Ray keeps one caller's calls in order).

    A call that raises (its arguments would not serialise, say) is told to
    `failed` and the thread goes on with the next: the job ends on the
    failure, and the actor's last reports still go out.
    """

    def __init__(self, failed: Callable[[BaseException], None]) -> None:
        self._failed = failed
        self._posted: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._make_calls, name="courier", daemon=True)
        self._thread.start()

    def post(self, call: Callable[[], object]) -> None:
        self._posted.put(call)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every call posted so far has been made; False if that took longer than `timeout_s`."""
        made = threading.Event()
        self.post(made.set)
        return made.wait(timeout_s)

    def _make_calls(self) -> None:
        while True:
            call = self._posted.get()
            try:
                call()
            except Exception as error:  # the job must learn of it; the calls after it are still made
                self._failed(error)


class Outbox:
    """A producer's items not yet taken by its consumers, per consumer, and the calls that carry them; thread-safe.

    `call(consumer, parcels)` makes the actor call (on the courier's thread)
    and returns its ObjectRef, which completes (ok or failed) once the
    consumer has taken every parcel of it: what frees them.  Each item
    counts against its consumer from `put` until then, waiting here or in a
    call, as a shared slot is held on the local engine.
    """

    def __init__(self, consumers: int, call: Callable[[int, list[Parcel]], Any], courier: Courier) -> None:
        self.counts = [0] * consumers   # items put and not yet taken, per consumer
        self.calls = 0                  # calls made so far
        self._call = call
        self._courier = courier
        self._waiting: list[list[Parcel]] = [[] for _ in range(consumers)]
        self._calling = [False] * consumers   # a call to this consumer is posted or untaken
        self._next = 0
        self._changed = threading.Condition()

    @property
    def total(self) -> int:
        return sum(self.counts)

    def least_loaded(self, candidates: Sequence[int]) -> int:
        """The candidate with the fewest untaken items; ties go round robin."""
        with self._changed:
            fewest = min(self.counts[c] for c in candidates)
            tied = [c for c in candidates if self.counts[c] == fewest]
            self._next += 1
            return tied[self._next % len(tied)]

    def put(self, consumer: int, parcel: Parcel) -> None:
        """Hand an item to a consumer: in a call at once if none to it is untaken, else in the next one."""
        with self._changed:
            self.counts[consumer] += 1
            self._waiting[consumer].append(parcel)
            if not self._calling[consumer]:
                self._calling[consumer] = True
                self._courier.post(lambda: self._send(consumer))

    def _send(self, consumer: int) -> None:
        with self._changed:
            parcels, self._waiting[consumer] = self._waiting[consumer], []
        try:
            ref = self._call(consumer, parcels)
        except BaseException:
            self._taken(consumer, len(parcels))
            raise
        self.calls += 1
        ref.future().add_done_callback(lambda _: self._taken(consumer, len(parcels)))

    def _taken(self, consumer: int, count: int) -> None:
        with self._changed:
            self.counts[consumer] -= count
            if self._waiting[consumer]:
                self._courier.post(lambda: self._send(consumer))
            else:
                self._calling[consumer] = False
            self._changed.notify_all()

    def wait_below(self, limit: int, stopped: Callable[[], bool]) -> bool:
        """Block until fewer than `limit` are untaken; False if the job ended first."""
        with self._changed:
            while self.total >= limit:
                if stopped():
                    return False
                self._changed.wait(POLL_S)
        return not stopped()
