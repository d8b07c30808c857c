"""Children that end by a deadline: each started in a session of its own, and killed with its process group on time.

A prepared run on a lent GPU has a few minutes in all. A child that runs past
its time must not take the rest of them, and must not stay behind: one left
alive keeps its CUDA contexts, and every later job would find the GPU busy.
So every wait is the smaller of its own bound and the time left before the
run's deadline, and a child that outlives it is killed together with
everything it started (its process group, and any descendant that left it).
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any

import psutil

REAP_S = 5.0  # once a child has ended: how long to wait for the ends of its pipes


@dataclass(frozen=True)
class Deadline:
    """A time (time.monotonic()) by which a run must be over."""

    end: float

    @staticmethod
    def after(seconds: float) -> Deadline:
        return Deadline(time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def before(self, seconds: float) -> Deadline:
        """The deadline `seconds` earlier: what a step may use when later steps keep that much for themselves."""
        return Deadline(self.end - seconds)

    def bound(self, own_s: float) -> tuple[float, str]:
        """How long a wait with its own bound `own_s` may last now, and which bound that is, in words."""
        left = self.left()
        if own_s <= left:
            return own_s, f"its own bound of {own_s:.0f} s"
        return left, f"the deadline ({left:.1f} s away when the wait began)"


NO_DEADLINE = Deadline(math.inf)


class Overrun(TimeoutError):
    """A child ran past its bound and was killed with its process group; what it had printed is kept."""

    def __init__(self, message: str, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr

    @staticmethod
    def killed(what: str, which: str, pids: list[int], stdout: str = "", stderr: str = "") -> Overrun:
        return Overrun(f"{what} ran past {which}: killed with its process group (pids {', '.join(map(str, pids))})",
                       stdout, stderr)


def kill_group(leader: int) -> list[int]:
    """SIGKILL the process group that `leader` leads and every descendant of it; the pids found.

    `leader` must not have been reaped yet (its pid could be another's). A
    descendant that started a session of its own has left the group; it is
    found through its parents, as long as they live.
    """
    try:
        found = [leader, *(child.pid for child in psutil.Process(leader).children(recursive=True))]
    except psutil.Error:  # the leader is gone; what it left in its group is still reached below
        found = []
    _kill_group_only(leader)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def _kill_group_only(leader: int) -> None:
    """SIGKILL what is left of the group `leader` led: its id stays taken while any member lives."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)


def start(command: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
    """`command` in a session (and so a process group) of its own, its output read as text through pipes."""
    return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def finish(child: subprocess.Popen[str], deadline: Deadline, own_s: float, what: str) -> tuple[str, str]:
    """Wait for `child` (started by `start`) to exit within min(own_s, the time left); its stdout and stderr.

    On time-out the child is killed with its group and Overrun raised. A
    child that ended leaves nothing behind either: its group is killed, so
    that no process it left holds its pipes (or a GPU) open.
    """
    timeout, which = deadline.bound(own_s)
    output = _Output(child)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        killed = kill_group(child.pid)
        child.wait()
        raise Overrun.killed(what, which, killed, *output.text()) from None
    _kill_group_only(child.pid)  # it is reaped: only its group's id is still safe to use
    return output.text()


def first_line(child: subprocess.Popen[str], deadline: Deadline, own_s: float, what: str) -> str:
    """The first line `child` (started by `start`) prints, within min(own_s, the time left); else it is killed."""
    assert child.stdout is not None
    timeout, which = deadline.bound(own_s)
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    if not ready:
        killed = kill_group(child.pid)
        child.wait()
        raise Overrun.killed(f"{what}, printing nothing,", which, killed)
    return child.stdout.readline()


class _Output:
    """A child's stdout and stderr, read to their end by threads (a full pipe would stop the child)."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.chunks: tuple[list[str], list[str]] = ([], [])
        self.readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                        for stream, into in zip((child.stdout, child.stderr), self.chunks) if stream is not None]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        for chunk in iter(lambda: stream.read(65536), ""):
            into.append(chunk)

    def text(self) -> tuple[str, str]:
        """What was read; the ends, unless a descendant that escaped every kill still holds a pipe after REAP_S."""
        until = time.monotonic() + REAP_S
        for reader in self.readers:
            reader.join(max(0.0, until - time.monotonic()))
        return "".join(self.chunks[0]), "".join(self.chunks[1])


def isolated(function: Callable[..., Any], *args: Any, deadline: Deadline = NO_DEADLINE, own_s: float = 120.0) -> Any:
    """`function(*args)` in a spawned process of its own session (a fresh CUDA context, gone with it); its result.

    Its failure comes back as one line (RuntimeError); a process that died
    without answering, with its exit code; one that runs past min(own_s, the
    time left) is killed with whatever it started (Overrun).
    """
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_isolated_main, args=(send, function, args), daemon=True)
    timeout, which = deadline.bound(own_s)
    process.start()
    send.close()
    assert process.pid is not None  # started
    answer: tuple[bool, Any] | None = None
    try:
        answered = receive.poll(timeout)
        if answered:
            with contextlib.suppress(EOFError):  # it died before it answered: its exit code says more
                answer = receive.recv()
    finally:
        killed = kill_group(process.pid)  # not joined yet, so its pid is still its own
        process.join()
    if not answered:
        raise Overrun.killed(f"{function.__name__}'s process", which, killed)
    if answer is None:
        raise RuntimeError(f"{function.__name__}'s process ended with exit code {process.exitcode} before it answered")
    ok, value = answer
    if not ok:
        raise RuntimeError(value)
    return value


def _isolated_main(send: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    with contextlib.suppress(PermissionError):  # already a group leader: nothing to do
        os.setsid()
    try:
        send.send((True, function(*args)))
    except BaseException as error:  # the parent learns any failure as one line
        send.send((False, f"{type(error).__name__}: {error}"))
