"""The first thing a spawned child does: tie its life to the main process's, before any heavy import.

A spawned child spends its first seconds unpickling its arguments, which
imports torch and the models; a Python-level watch (a thread, a signal
handler) can only start after that.  A `Lifeline` placed first among the
child's arguments runs `arm` while it is unpickled, before the arguments
that import anything heavy: it asks the kernel to SIGKILL the child when the
thread that spawned it dies (PR_SET_PDEATHSIG), so a main process killed
outright takes every child with it at once, even one still importing.

Its module imports only the standard library and `rnb.pipeline.dotted`, so
unpickling the child's entry point (`run`) is cheap too.

Children ignore Ctrl-C and SIGTERM from their first instruction: stopping
them in order is the main process's business, and a Ctrl-C to the whole
process group must not make every child print a KeyboardInterrupt
traceback.  Only a disposition of "ignored" survives exec, and setting it in
the main process would drop a signal meant for the main process during the
spawn; so `spawning_children` spawns through a two-line shell that ignores
both and then execs Python.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.spawn
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rnb.pipeline.dotted import load_object

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_SPAWNED_PYTHON = Path(__file__).with_name("spawned-python")


@contextlib.contextmanager
def spawning_children() -> Iterator[None]:
    """Processes spawned inside start with Ctrl-C and SIGTERM ignored (multiprocessing's spawn start method)."""
    previous = multiprocessing.spawn.get_executable()
    os.environ["RNB_CHILD_PYTHON"] = sys.executable
    multiprocessing.spawn.set_executable(str(_SPAWNED_PYTHON))
    try:
        yield
    finally:
        multiprocessing.spawn.set_executable(previous)


class Lifeline:
    """Pickles to a call of `arm` with the spawning process's pid."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return arm, (os.getpid(),)


def arm(parent: int) -> None:
    """In the child: die with the parent; if it is already gone, exit now rather than start work for nobody.

    Ctrl-C and SIGTERM stay ignored (the main process spawns children with
    both ignored, which exec keeps): stopping children in order is the main
    process's business, and a Ctrl-C to the whole process group must not make
    each child print a KeyboardInterrupt traceback.
    """
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def run(_armed: None, target: str, *args: Any) -> None:
    """A child's entry point: `_armed` is what unpickling the Lifeline left; `target` is the real entry point."""
    load_object(target)(*args)
