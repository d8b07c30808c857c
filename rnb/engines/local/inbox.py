"""A queue from the children to the main process, read by a thread of the main process.

The status queue is a pipe (the results ring, rnb.engines.local.ring, shows
a message only once it is whole, but is read the same way).  A child killed
in the middle of writing a message leaves the pipe holding
part of one: a reader then blocks for ever waiting for the rest, since the
main process itself holds the pipe's write end and no end of file comes.
Reading on a thread keeps that wait off the main thread, which only takes in
what the reader has received and so can always end the job.  A reader stuck
that way is reported (`stuck`), and what came after the cut is lost.
"""
from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Any

# How long one read waits before the reader looks whether it should stop: also the delay of `settle`.
READ_POLL_S = 0.01


class Inbox:
    """Moves messages from a multiprocessing queue into a local one, on a daemon thread."""

    def __init__(self, source: Any, name: str) -> None:
        self.source = source
        self.name = name
        self.broken: str | None = None   # why reading stopped early, if it did
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._empty_since = 0.0          # when the latest read that found the pipe empty began
        self._thread = threading.Thread(target=self._read, name=f"inbox-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        # Signals are the main thread's to handle; this thread must not be the one the kernel hands them to.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            began = time.monotonic()
            try:
                item = self.source.get(timeout=READ_POLL_S)
            except queue.Empty:
                self._empty_since = began
                if self._closing.is_set():
                    return
                continue
            except Exception as error:  # bytes that do not unpickle: a writer died mid-message, framing is lost
                self.broken = f"{type(error).__name__}: {error}"
                return
            self._items.put(item)

    def get(self, timeout: float) -> Any:
        """The next message, waiting up to `timeout` seconds; raises queue.Empty."""
        return self._items.get(timeout=timeout) if timeout > 0 else self._items.get_nowait()

    def take_all(self) -> list[Any]:
        """Every message received so far, without waiting."""
        items = []
        while True:
            try:
                items.append(self._items.get_nowait())
            except queue.Empty:
                return items

    def settle(self, since: float, timeout: float = 1.0) -> None:
        """Wait until the reader has found the pipe empty after `since` (time.monotonic()): all sent before is in."""
        deadline = time.monotonic() + timeout
        while self._empty_since < since and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(READ_POLL_S / 2)

    def close(self, timeout: float = 1.0) -> None:
        """Let the reader finish what is in the pipe and stop; it may stay stuck in a message cut short."""
        self._closing.set()
        self._thread.join(timeout)

    @property
    def stuck(self) -> bool:
        """True when closing left the reader waiting for the rest of a message that will never come."""
        return self._closing.is_set() and self._thread.is_alive()
