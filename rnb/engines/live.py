"""What a running job shows on stderr while it runs: its start-up, then the items done.

Start-up (loading models, warming decoders) can take half a minute, and a
long job on the CPU many minutes; neither should look dead, on a terminal
or in a log file.  Both engines' drivers feed one `LiveProgress`:

- on a terminal, a start-up bar (processes ready of all, the one still
  loading) and then an items bar, each left standing when it ends;
- elsewhere (a pipe, a file, CI, a tuner's child job), a `start-up:` line
  every EVERY_S while start-up lasts that long, a `progress:` line when it
  completes, every EVERY_S after and at the end;
- nothing at all with -q/--quiet.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Literal, TextIO

from tqdm import tqdm

EVERY_S = 5.0    # between two lines when stderr is not a terminal
REDRAW_S = 0.5   # between two redraws of the start-up bar

Mode = Literal["bar", "lines", "off"]


def progress_mode(quiet: bool, stream: TextIO) -> Mode:
    """A bar on a terminal, lines elsewhere, nothing when asked to be quiet."""
    if quiet:
        return "off"
    return "bar" if stream.isatty() else "lines"


def waiting_for(processes: Sequence[str], ready: Collection[str]) -> str:
    """The first process (in spawn order) still loading, and how many more are: `step1-g0-r0 and 2 others`."""
    waiting = [name for name in processes if name not in ready]
    if not waiting:
        return "none"
    more = len(waiting) - 1
    return waiting[0] + (f" and {more} other{'s' if more > 1 else ''}" if more else "")


class LiveProgress:
    """A job's live progress on `stream`: call `starting` while processes load, `running` while items finish."""

    def __init__(self, processes: Sequence[str], target: int, mode: Mode, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.processes = tuple(processes)
        self.target = target
        self.mode = mode
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.began = clock()
        self.start: float | None = None
        self.said_at = self.began   # when the latest line was written
        self.ran_at = self.began    # when `running` was last called
        self.done = -1              # items finished as last told; -1 before the first running()
        self.bar: tqdm | None = None
        if mode == "bar":
            self.bar = tqdm(total=len(self.processes), desc="start-up", file=self.stream, leave=True,
                            bar_format="{desc}: {n_fmt} of {total_fmt} processes ready after {elapsed}{postfix}")

    def starting(self, ready: Collection[str]) -> None:
        """Start-up's progress: how many processes are ready, and which is still loading."""
        now = self.clock()
        count = sum(1 for name in self.processes if name in ready)
        if self.bar is not None:
            self.bar.set_postfix_str(f"waiting for {waiting_for(self.processes, ready)}", refresh=False)
            self.bar.update(count - self.bar.n)
            self._redraw(now)
        elif self.mode == "lines" and now - self.said_at >= EVERY_S and count < len(self.processes):
            self._say(f"start-up: {count} of {len(self.processes)} processes ready after {now - self.began:.0f} s; "
                      f"waiting for {waiting_for(self.processes, ready)}", now)

    def started(self) -> None:
        """Start-up is complete (its bar closes, so what the driver logs next has its own line)."""
        self.start = self.clock()
        if self.bar is not None:
            self.bar.set_postfix_str("all ready", refresh=False)
            self.bar.update(len(self.processes) - self.bar.n)
            self.bar.close()
            self.bar = None

    def running(self, done: int) -> None:
        """Items finished so far; the first call opens the items bar, or writes the first line."""
        now = self.ran_at = self.clock()
        first = self.done < 0
        self.done = done
        if self.mode == "bar":
            if self.bar is None:
                self.bar = tqdm(total=self.target, desc="items", unit=" items", file=self.stream, leave=True)
            self.bar.update(done - self.bar.n)
            self._redraw(now)
        elif self.mode == "lines" and (first or now - self.said_at >= EVERY_S):
            self._say(self.line(done, now), now)

    def close(self, done: int) -> None:
        """The job has ended with `done` items: the bar stays as it last stood; a last line says so too.

        Its rate is over the time until the last `running` call (the flag),
        not the time it took to stop the processes.
        """
        shown = self.start is not None and self.done >= 0   # the items' progress was under way
        if self.bar is not None:
            if shown:
                self.bar.update(done - self.bar.n)
            self.bar.close()
            self.bar = None
        elif self.mode == "lines" and shown:
            self._say(self.line(done, self.ran_at), self.ran_at)

    def line(self, done: int, now: float) -> str:
        """`progress: 120 of 2000 items, 23.9 items/s, 5.0 s`: since the start gate opened."""
        assert self.start is not None
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        return f"progress: {done} of {self.target} items, {rate:.1f} items/s, {elapsed:.1f} s"

    def _redraw(self, now: float) -> None:
        """Redraw the bar now and then: its elapsed time moves on while nothing is counted (a model still
        loading, a slow first item)."""
        if self.bar is not None and now - self.said_at >= REDRAW_S:
            self.said_at = now
            self.bar.refresh()

    def _say(self, text: str, now: float) -> None:
        self.said_at = now
        print(text, file=self.stream, flush=True)
