"""How far each runner has got, in memory its driver reads: what stall detection watches, at no message per item.

A runner writes six numbers as items pass it: how many items have left it,
the item it holds now (the oldest it took and has not passed on) with the
time it took it, since when it has been inside its model (a call or a
flush, with the device work it queued), 0 while it is not, how many calls
that did work (a call, or a flush that handed something on) it has
completed, and the longest of those, -1 until one.  The fourth tells the
runner that is stuck from those that hold items only because the next step
stopped taking them; a completed call is progress, as an item leaving is;
the last lets the watch judge a long call against the calls its step has
made.  The local engine keeps them in shared memory (a RawArray
per runner), which the main process reads whenever it looks; a Ray actor
keeps them in its own memory and answers the driver's periodic asks.  Writing
them costs a few stores per item and hop; nothing is sent.

The numbers are written without a lock, one at a time: a reader may see a
hold's item before its time or a count one behind, never a value that was
not written; a stall lasts seconds, and the next look is consistent.
"""
from __future__ import annotations

from collections.abc import MutableSequence
from dataclasses import dataclass

# The cells of a runner's progress, in order.
LEFT, HELD_ITEM, HELD_SINCE, CALLING_SINCE, CALLS, SLOWEST_CALL = range(6)
CELLS = 6
_NONE = -1.0  # HELD_ITEM when nothing is held, SLOWEST_CALL before a call did work


def empty_cells() -> list[float]:
    """The cells of a runner that has taken nothing yet, for an engine that keeps them in a plain list."""
    return [0.0, _NONE, 0.0, 0.0, 0.0, _NONE]


@dataclass(frozen=True)
class ProgressSnapshot:
    """One look at one runner's progress."""

    left: int                   # items (cards) that have left the runner, passed on or counted
    held_item: int | None       # the item it holds, if any: the oldest it took and has not passed on
    held_since: float | None    # when it took that item (epoch seconds, the job's clock)
    calling_since: float | None = None   # since when it has been inside its model, if it is
    slowest_call_s: float | None = None  # its longest call that did work, once one has
    calls: int = 0                       # how many calls that did work it has completed


class Progress:
    """A runner's progress cells (a RawArray('d', CELLS) in shared memory, or a list), written by the runner.

    The runner keeps its own count and hold beside the cells, so a hop only
    writes shared memory (a read of it costs as much as a write).
    """

    def __init__(self, cells: MutableSequence[float]) -> None:
        self.cells = cells
        self._left = int(cells[LEFT])
        self._holding = cells[HELD_ITEM] >= 0
        self._calling_since = cells[CALLING_SINCE]
        self._slowest = cells[SLOWEST_CALL]
        self._calls = int(cells[CALLS])

    def took(self, item_id: int, at: float) -> None:
        """The runner took item `item_id` at `at`; a hold already running (a batch filling) keeps its older item."""
        if not self._holding:
            self._holding = True
            cells = self.cells
            cells[HELD_SINCE] = at   # before the item: a reader who sees the item sees its time
            cells[HELD_ITEM] = item_id

    def calling(self, at: float) -> None:
        """The runner is calling its model (or its flush) from `at` on."""
        self._calling_since = at
        self.cells[CALLING_SINCE] = at

    def called(self, at: float | None) -> None:
        """The model's call returned and the device work it queued is done, at `at` if the call did work (None for
        a flush that handed nothing on: an idle runner asks every few ms, and those asks say nothing of its calls)."""
        cells = self.cells
        if at is not None and self._calling_since:
            self._calls += 1
            cells[CALLS] = self._calls
            if at - self._calling_since > self._slowest:
                self._slowest = at - self._calling_since
                cells[SLOWEST_CALL] = self._slowest
        cells[CALLING_SINCE] = 0.0

    def passed(self, count: int) -> None:
        """`count` items left the runner (handed on, or counted at the final step); it holds nothing now."""
        self._holding = False
        self._left += count
        cells = self.cells
        cells[HELD_ITEM] = _NONE
        cells[LEFT] = self._left

    def read(self) -> ProgressSnapshot:
        left, item, since, calling, calls, slowest = self.cells[:CELLS]
        held = item >= 0
        return ProgressSnapshot(int(left), int(item) if held else None, since if held else None, calling or None,
                                slowest if slowest >= 0 else None, int(calls))


# The client's cells: since when it has had nothing to send (0 while it sends), when its next request is due (epoch
# seconds on the job's clock) and that request's number.
IDLE_SINCE, NEXT_DUE, NEXT_ITEM = range(3)
CLIENT_CELLS = 3


def empty_client_cells() -> list[float]:
    return [0.0, 0.0, _NONE]


@dataclass(frozen=True)
class ClientWait:
    """The client with nothing to send until its next request falls due: since when, when it is due, which one."""

    since: float
    due: float
    item: int


class ClientCells:
    """The client's cells (a RawArray('d', CLIENT_CELLS) in shared memory, or a list), written by the client.

    A load whose next request falls due long after the pipeline emptied
    leaves a job with nothing to do, which only the client can tell: the
    stall watch reads these (rnb.engines.stall).  Written without a lock,
    the time it began last: a reader that sees a wait sees its due time.
    """

    def __init__(self, cells: MutableSequence[float]) -> None:
        self.cells = cells

    def waiting(self, since: float, due: float, item: int) -> None:
        cells = self.cells
        cells[NEXT_DUE] = due
        cells[NEXT_ITEM] = item
        cells[IDLE_SINCE] = since

    def sending(self) -> None:
        self.cells[IDLE_SINCE] = 0.0

    def read(self) -> ClientWait | None:
        since, due, item = self.cells[:CLIENT_CELLS]
        return ClientWait(since, due, int(item)) if since else None
