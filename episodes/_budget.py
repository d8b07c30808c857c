"""What a cache holds in memory, bounded by its byte budget: kept mini-MP4s and fetches not yet handed over.

Two kinds of bytes share the budget. Kept mini-MP4s (whole episodes, in
least-recently-used order) cost their size and may be dropped at any time:
a later read fetches them again. A fetch holds the source bytes it reads
from the moment it starts until its reader has them (a `Hold`): bytes on
the wire and bytes landed but not yet decoded are memory as much as kept
ones are.

A fetch made ahead of its reader (a prefetch) starts only where its bytes
fit beside everything else, after dropping kept mini-MP4s; so how far
ahead a reader gets is the budget's call, not a count. A fetch a reader
waits for now makes room: it drops kept mini-MP4s, then prefetches nobody
has claimed yet, newest first (their bytes are dropped too, once landed),
and waits for those still on the wire. It never waits for another read's
hold, which that read's own thread may be about to release: reads asked
for now on several threads at once, or one alone larger than the budget,
may go over it, and `peak` says by how much.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

V = TypeVar("V")
HoldState = Literal["in flight", "landed", "claimed", "dropped", "released"]


@dataclass(eq=False)
class Hold:
    """Source bytes a fetch holds until its reader is done with them.

    `ahead`: made for a reader that has not asked yet (a prefetch), and so
    dropped to make room for a read asked for now unless claimed first.
    `on_drop` lets go of the bytes a dropped hold referred to.
    """

    nbytes: int
    ahead: bool
    state: HoldState = "in flight"
    on_drop: Callable[[], None] | None = field(default=None, repr=False)


class Holds(Protocol):
    """What fetches do with the budget, whatever the cache keeps in it."""

    def hold_ahead(self, nbytes: int) -> Hold | None: ...

    def hold_now(self, nbytes: int) -> Hold: ...

    def landed(self, hold: Hold) -> None: ...

    def claim(self, hold: Hold) -> bool: ...

    def release(self, hold: Hold, nbytes: int | None = None) -> None: ...


class ByteBudget(Generic[V]):
    """Kept mini-MP4s (an LRU of values with sizes) and holds, never above `limit` bytes together (see the module)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._cond = threading.Condition(threading.Lock())
        self._kept: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._holds: list[Hold] = []
        self.kept_bytes = 0
        self.held_bytes = 0       # kept bytes plus every hold's
        self.peak = 0
        self.evictions = 0
        self.skipped = 0          # prefetches that did not fit
        self.dropped = 0          # prefetches dropped for a read asked for now

    # ---- kept mini-MP4s ----------------------------------------------------------

    def get(self, key: Hashable) -> V | None:
        """The kept value, now the most recently used; None when it is not kept."""
        with self._cond:
            kept = self._kept.get(key)
            if kept is None:
                return None
            self._kept.move_to_end(key)
            return kept[0]

    def __contains__(self, key: Hashable) -> bool:
        with self._cond:
            return key in self._kept

    def __len__(self) -> int:
        with self._cond:
            return len(self._kept)

    def keep(self, key: Hashable, value: V, size: int, hold: Hold | None = None) -> bool:
        """Keep `value` (`size` bytes) in place of `hold`, dropping the least recently used to fit; False when even
        alone it would not fit beside the holds (then it is not kept, and `hold` is released all the same)."""
        with self._cond:
            if hold is not None and hold in self._holds:
                self._release(hold)
                self._cond.notify_all()
            if self.held_bytes - self.kept_bytes + size > self.limit:
                return False
            self._make_room(size)
            self._kept[key] = (value, size)
            self.kept_bytes += size
            self._add(size)
            return True

    def clear(self) -> None:
        with self._cond:
            self.held_bytes -= self.kept_bytes
            self.kept_bytes = 0
            self._kept.clear()

    # ---- holds -------------------------------------------------------------------

    def hold_ahead(self, nbytes: int) -> Hold | None:
        """A prefetch's hold, where `nbytes` fit beside everything held once kept mini-MP4s are dropped; else None."""
        with self._cond:
            if self.held_bytes - self.kept_bytes + nbytes > self.limit:
                self.skipped += 1
                return None
            self._make_room(nbytes)
            return self._hold(nbytes, ahead=True)

    def hold_now(self, nbytes: int) -> Hold:
        """A hold for a read asked for now: room made as the module says, then taken whether it fits or not."""
        with self._cond:
            while True:
                self._make_room(nbytes)
                if self.held_bytes + nbytes <= self.limit:
                    break
                landed = [h for h in self._holds if h.ahead and h.state == "landed"]
                if landed:
                    self._drop(landed[-1])
                    continue
                flying = [h for h in self._holds if h.ahead and h.state in ("in flight", "dropped")]
                if not flying:
                    break
                for hold in flying:
                    if hold.state == "in flight":
                        hold.state = "dropped"   # its bytes go once they land (landed(), keep(), release())
                        self.dropped += 1
                self._cond.wait()
            return self._hold(nbytes, ahead=False)

    def landed(self, hold: Hold) -> None:
        """The hold's bytes have all arrived (or failed to): a prefetch nobody has claimed may now be dropped."""
        with self._cond:
            if hold.state == "in flight":
                hold.state = "landed"
            elif hold.state == "dropped" and hold in self._holds:
                self._release(hold)
                self._forget(hold)
            self._cond.notify_all()

    def claim(self, hold: Hold) -> bool:
        """A reader takes the hold's bytes: never dropped from now on. False when they were dropped already."""
        with self._cond:
            if hold.state == "dropped":
                return False
            hold.state = "claimed"
            return True

    def release(self, hold: Hold, nbytes: int | None = None) -> None:
        """Its reader is done with `nbytes` of the hold's bytes (all of them by default)."""
        with self._cond:
            if hold not in self._holds:
                return
            if hold.state == "dropped" or nbytes is None or nbytes >= hold.nbytes:
                self._release(hold)
                self._forget(hold)
            else:
                hold.nbytes -= nbytes
                self.held_bytes -= nbytes
            self._cond.notify_all()

    # ---- with the lock held ------------------------------------------------------

    def _hold(self, nbytes: int, ahead: bool) -> Hold:
        hold = Hold(nbytes, ahead)
        self._holds.append(hold)
        self._add(nbytes)
        return hold

    def _add(self, nbytes: int) -> None:
        self.held_bytes += nbytes
        self.peak = max(self.peak, self.held_bytes)

    def _release(self, hold: Hold) -> None:
        if hold in self._holds:
            self._holds.remove(hold)
            self.held_bytes -= hold.nbytes
            hold.nbytes = 0
        if hold.state != "dropped":
            hold.state = "released"
            hold.on_drop = None   # what it would have let go of is its reader's now, and goes with it

    def _forget(self, hold: Hold) -> None:
        if hold.on_drop is not None:
            hold.on_drop()
            hold.on_drop = None

    def _drop(self, hold: Hold) -> None:
        hold.state = "dropped"
        self.dropped += 1
        self._holds.remove(hold)
        self.held_bytes -= hold.nbytes
        hold.nbytes = 0
        self._forget(hold)

    def _make_room(self, nbytes: int) -> None:
        """Drop kept mini-MP4s, least recently used first, until `nbytes` more fit (or none is left)."""
        while self._kept and self.held_bytes + nbytes > self.limit:
            _, (_, size) = self._kept.popitem(last=False)
            self.kept_bytes -= size
            self.held_bytes -= size
            self.evictions += 1
