"""Ctrl-C and SIGTERM from the command's first line to its exit: what a stop does, decided once for every engine.

A stop is SIGINT (Ctrl-C, exit 130) or SIGTERM (kill, a scheduler, a
container: exit 143).  Until a job's log directory exists there is nothing
to keep, so a stop raises `Stopped` wherever it lands (an import, the
config's checks, Ray's start, the GPUs' reservation): the command unwinds,
each `finally` and context manager stopping what it started, says so in
one line and exits with the stop's code, having written nothing.  A driver
opens its job's directory through `hold()` (rnb.engines.job.open_job_dir):
from then on a stop raises nothing, it is the job's ending.  Inside
`reacting(reaction)` the driver's reaction runs at once (its flag raised
with `interrupted` or `terminated`: the job ends as any job ends, with its
log), and `cut_short(call, ...)` lets a stop end the wait for a call that
may block for long (the local engine's children starting while its fork
server imports), which runs on a thread of its own so that no stop lands
half way through it; the driver then unwinds from itself.  After the job, a stop
is noted and the summary finishes: the log is written.

`install` sets the handlers.  benchmark.py and rnb-benchmark call it as
their first act, before anything slow is imported, and again after a
library that sets its own (ray.init sets SIGTERM's).  Only the first stop
acts; a second, while the first unwinds or ends the job, is noted and
changes nothing.  The children ignore both signals
(rnb.engines.local.lifeline): only the main process decides.

This module imports nothing but the standard library and rnb.core's
termination, and not even dataclasses (which imports inspect, 20 ms), so
that it is the command's first import: benchmark.py blocks both signals
before it (a stop meanwhile waits, pending), and `install` lets them through
once its handlers are set.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from rnb.core.termination import Termination

if TYPE_CHECKING:
    from concurrent.futures import Future

# What stops a job from outside, by signal number, and how its log names the ending.
STOP_SIGNALS: dict[int, Termination] = {signal.SIGINT: Termination.INTERRUPTED, signal.SIGTERM: Termination.TERMINATED}
CUT_SHORT_POLL_S = 0.05   # how often a wait in cut_short looks whether its call ended (a stop ends it at once)


class Stop:
    """A stop signal the command received, and when (epoch seconds): a record, written as a plain class to keep
    this module's import light."""

    __slots__ = ("number", "at")

    def __init__(self, number: int, at: float) -> None:
        self.number = number
        self.at = at

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stop) and (self.number, self.at) == (other.number, other.at)

    def __hash__(self) -> int:
        return hash((self.number, self.at))

    @property
    def termination(self) -> Termination:
        return STOP_SIGNALS[self.number]

    @property
    def exit_code(self) -> int:
        """128 plus the signal's number, as a shell reports a process the signal ended: 130, 143."""
        return 128 + self.number

    def sentence(self, when: str) -> str:
        """`interrupted (SIGINT) <when>`: how the command's one line names the stop."""
        return f"{self.termination.reason} ({signal.Signals(self.number).name}) {when}"


class Stopped(BaseException):
    """A stop came while nothing was kept: the command unwinds and exits with `stop.exit_code`.

    A BaseException, as KeyboardInterrupt is, so that no `except Exception`
    on the way mistakes it for a failure of its own.
    """

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.sentence("before the job started: nothing was written"))
        self.stop = stop


class Stops:
    """One process's stop: the first received, and what it does now (raise, react, cut a call short)."""

    def __init__(self) -> None:
        self.received: Stop | None = None
        self.held = False          # a job's directory exists: a stop is the job's ending, never an exception
        self.reaction: Callable[[Stop], object] | None = None
        self.cutting = False       # waiting in cut_short: the first stop raises even though held

    def on_signal(self, number: int, frame: FrameType | None = None) -> None:
        """The handler: note the first stop, run the driver's reaction, raise where nothing is kept."""
        first = self.received is None
        if first:
            self.received = Stop(number, time.time())
        assert self.received is not None
        if self.reaction is not None:
            self.reaction(self.received)
        if first and (not self.held or self.cutting):
            raise Stopped(self.received)

    def hold(self) -> None:
        """From now on a stop is the job's: it raises nothing.  Stopped if one came before (and was not raised:
        a library that caught every exception swallowed it)."""
        if self.received is not None and not self.held:
            raise Stopped(self.received)
        self.held = True

    def answered_elsewhere(self, number: int) -> Stopped:
        """A library's own handler answered this signal (ray.init sets one for SIGTERM that exits the process):
        the stop is ours all the same, noted as received; raise what this returns."""
        if self.received is None:
            self.received = Stop(number, time.time())
        return Stopped(self.received)

    @contextmanager
    def reacting(self, reaction: Callable[[Stop], object]) -> Iterator[None]:
        """Inside, a stop calls `reaction(stop)` (also one received before): it must be quick and idempotent."""
        before = self.reaction
        self.reaction = reaction
        try:
            if self.received is not None:
                reaction(self.received)
            yield
        finally:
            self.reaction = before

    def cut_short(self, call: Callable[[], object], abandon: Callable[[], object], grace_s: float) -> bool:
        """Run `call` on the process's calls thread (`_calls_thread`) while this one waits; False if a stop came
        before or during it.

        No stop lands inside `call` (Python runs handlers on the main thread
        only): a call that must not be cut at an arbitrary instant, such as
        a child's start half sent to the fork server, runs whole or not at
        all.  A stop ends the wait: `call` gets `grace_s` to finish (it may
        look at `received` to end early), then `abandon()` ends what it
        waits for, and it is waited for.  An exception of the call raises
        here, unless a stop came (it may be the abandoning's consequence).
        """
        from concurrent.futures import wait  # here, not at the top: this module is the command's first import

        if self.received is not None:
            return False
        running = _calls_thread().submit(call)
        try:
            self.cutting = True
            try:
                if self.received is not None:   # came before the wait: its handler raised nothing
                    raise Stopped(self.received)
                while not running.done():   # a timed wait: a signal the calls thread took wakes no untimed one
                    wait([running], CUT_SHORT_POLL_S)
            finally:
                self.cutting = False
        except Stopped:
            if wait([running], grace_s).not_done:
                abandon()
                wait([running])
            return False
        running.result()
        return self.received is None


class _CallsThread:
    """One daemon thread that runs every cut_short call of this process, one at a time, and lives as long as the
    process: a process a call starts may have the kernel end it when the thread that started it ends (the fork
    server's PR_SET_PDEATHSIG).  A daemon thread is not joined at exit, so such a process outlives the atexit
    handlers that stop it in order (rnb.engines.local.lifeline's fork server, waited for there)."""

    def __init__(self) -> None:
        import queue
        import threading

        self._calls: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="cut-short", daemon=True).start()

    def submit(self, call: Callable[[], object]) -> Future[object]:
        from concurrent.futures import Future

        running: Future[object] = Future()
        self._calls.put((call, running))
        return running

    def _serve(self) -> None:
        while True:
            call, running = self._calls.get()
            running.set_running_or_notify_cancel()
            try:
                running.set_result(call())
            except BaseException as error:  # the waiting thread raises it
                running.set_exception(error)


_calls: _CallsThread | None = None


def _calls_thread() -> _CallsThread:
    global _calls
    if _calls is None:
        _calls = _CallsThread()
    return _calls


STOPS = Stops()   # the process's own; benchmark.py's handlers feed it


def install() -> None:
    """Set this process's SIGINT and SIGTERM handlers to STOPS', then let through a stop held back till now."""
    for number in STOP_SIGNALS:
        signal.signal(number, STOPS.on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextmanager
def handlers_kept() -> Iterator[None]:
    """Inside, a library may set SIGINT's and SIGTERM's handlers (ray.init sets one that exits the process): the
    handlers from before are put back as it returns."""
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
