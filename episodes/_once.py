"""One maker per key: a value made once, while callers that ask for it meanwhile wait for that one.

A cache's MP4 indexes (kept once made) and its whole-episode fetches
(forgotten once made: the LRU keeps them) are both got this way, so that
two readers of one file or one episode never fetch it twice at once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class OncePerKey(Generic[K, T]):
    """`make()` run once per key while it is in flight; other callers wait for its result.

    With `keep` the finished value stays as a memo until `forget`; a failed
    attempt is always forgotten, so a later call tries again.
    """

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._table: dict[K, Future[T]] = {}

    def get(self, key: K, make: Callable[[], T], joined: Callable[[bool], None] | None = None) -> tuple[T, bool]:
        """The value and whether this caller made it; `joined(made)` is told which before anyone waits."""
        with self._lock:
            future = self._table.get(key)
            owner = future is None
            if future is None:
                future = self._table[key] = Future()
        if joined is not None:
            joined(owner)
        if not owner:
            return future.result(), False
        try:
            value = make()
        except BaseException as exc:
            self._drop(key, future)
            future.set_exception(exc)
            raise
        if not self._keep:
            self._drop(key, future)
        future.set_result(value)
        return value, True

    def forget(self, key: K, which: Callable[[T], bool]) -> None:
        """Let go of the memo of `key` where `which` says it is the one to drop: the next caller makes it afresh."""
        with self._lock:
            future = self._table.get(key)
            if future is not None and future.done() and future.exception() is None and which(future.result()):
                del self._table[key]

    def _drop(self, key: K, future: Future[T]) -> None:
        with self._lock:
            if self._table.get(key) is future:
                del self._table[key]
