"""How a child starts: forked from a server that has torch loaded, tied to the main process's life.

Every child is forked from multiprocessing's fork server, started once per
main process with the heavy libraries imported (`children_context`): a
child that spawned afresh spent 2 to 4 s of CPU importing torch,
torchvision and torchcodec before doing anything, on every start of every
job.  The server itself is started by exec, so nothing of the main
process (its threads, a CUDA context) is forked.

A child still unpickles its arguments first, which imports the models; a
Python-level watch (a thread, a signal handler) can only start after that.
A `Lifeline` placed first among the child's arguments runs `arm` while it
is unpickled, before the arguments that import anything: it asks the kernel
to SIGKILL the child when its parent, the fork server, dies
(PR_SET_PDEATHSIG); the server leaves as soon as the main process is gone
(its pipe from the main process closes), so a main process killed outright
takes every child with it at once, even one still importing.  `arm` also
gives the child what a spawned child would have had from the moment it was
started, not from the server's: the main process's environment and its
stdout and stderr as they are now.

`arm` also registers the stdlib's faulthandler on STACKS_SIGNAL, writing
every thread's Python stack to the file the main process named: asked while
the job stalls, a child answers even when its Python code cannot run (a
deadlock, a read or device call that never returns, an import that hangs),
since the handler runs in C.

Its module imports only the standard library, `rnb.pipeline.dotted` and
`rnb.engines.stopping`, so unpickling the child's entry point (`run`) is
cheap too.

Children ignore Ctrl-C and SIGTERM from their first instruction: stopping
them in order is the main process's business, and a Ctrl-C to the whole
process group must not make every child print a KeyboardInterrupt
traceback.  Only a disposition of "ignored" survives exec, and setting it in
the main process would drop a signal meant for the main process during the
start; so `spawning_children` starts the fork server (and any child spawned
afresh) through a two-line shell that ignores both and then execs Python,
and a forked child inherits the server's dispositions.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.reduction
import multiprocessing.resource_tracker
import multiprocessing.spawn
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import IO, Any, Protocol

from rnb.engines.stopping import STOPS
from rnb.pipeline.dotted import load_object

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_TIMERSLACK = 29
# How late the kernel may end a child's timed sleep to batch wake-ups: 1 us, not Linux's 50 (docs/performance.md).
TIMER_SLACK_NS = 1000
_SPAWNED_PYTHON = Path(__file__).with_name("spawned-python")
# What the main process sends a child to have it write its Python stacks (faulthandler, all threads).
STACKS_SIGNAL = signal.SIGUSR1
_stacks_file: IO[str] | None = None  # kept open for faulthandler, which writes to its descriptor
# What the fork server imports before forking anyone, where the job uses it (`children_context`): the imports
# that cost a child most (torch about 2 s of CPU here, torchvision and torchcodec 2.4 s more, torch._dynamo mostly).
PRELOADED = ("torch", "torchvision", "torchcodec")
# Model modules whose import loads torch but neither torchvision nor torchcodec (tests/engines/test_fork_server.py
# holds each to it), and the source kinds whose client reads episodes (torchcodec).
TORCH_ONLY_MODELS = frozenset({"models.aggregator", "models.batcher", "models.clips", "models.toy"})
EPISODE_SOURCES = frozenset({"dataset", "videos"})
# Imported last by every server: its objects frozen, the server leaves at once when the job ends (its last garbage
# collection walked every object the preload made: about 1 s that the job's end waited for), and no child's
# collection walks them.
FREEZE_PRELOADED = "rnb.engines.local.freeze_preloaded"
_early_preload: tuple[str, ...] = ()  # what the running server preloads, if `start_fork_server` started it
STOP_WAIT_S = 10.0  # how long a process leaving waits for its fork server to go (one still importing finishes first)


def early_preload(document: object) -> tuple[str, ...]:
    """What the children of the job a config's JSON describes will import of PRELOADED, as the fork server should.

    torch alone where its source reads no episodes and every model's
    module is one of TORCH_ONLY_MODELS, else all of PRELOADED: a loader
    decodes with torchcodec and resizes with torchvision, and a network
    beyond the toy ones is most likely torchvision's.  A server started
    first preloads them beside the main process's imports, which spares the
    job a second server's start (about 3 s and 2 CPU-s on two cores).  A
    document not a config's shape counts as torch alone.  A wrong guess
    costs time, never correctness: a child imports what its server lacks.
    """
    if not isinstance(document, dict):
        return ("torch",)
    source, steps = document.get("source"), document.get("pipeline")
    kind = next(iter(source), None) if isinstance(source, dict) else None
    models = [step.get("model") for step in steps if isinstance(step, dict)] if isinstance(steps, list) else []
    light = kind not in EPISODE_SOURCES and all(
        isinstance(model, str) and model.rpartition(".")[0] in TORCH_ONLY_MODELS for model in models)
    return ("torch",) if light else PRELOADED


def start_fork_server(preload: Sequence[str] = ("torch",)) -> None:
    """Start this process's fork server now, importing `preload` while this process imports its own.

    Started at the first child, the server imported torch only after the
    main process had imported it and checked the config: every job started
    about 2 s later than it needed to, on an idle host with two cores.
    Started first, it preloads what `early_preload` guessed from the
    config, since what the job loads is not known yet; `children_context`
    replaces it where the job turns out to use more of PRELOADED.
    """
    global _early_preload
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*preload, FREEZE_PRELOADED])
    # The server starts multiprocessing's resource tracker first, unless it runs: started here it would be a child
    # of spawning_children's, which dies with this process, leaving every shared segment of a killed job behind.
    multiprocessing.resource_tracker.ensure_running()
    with spawning_children():
        multiprocessing.forkserver.ensure_running()
    _early_preload = tuple(preload)


def children_context(document: object = None) -> ForkServerContext:
    """The context every child starts in: forked from a server that has imported what the job uses of PRELOADED.

    What the job uses is what this process has loaded of PRELOADED, and
    what `early_preload` says the config's JSON (`document`) needs: this
    process imports torchvision and torchcodec only where it decodes or
    builds a network itself, which a job's main process does not.  The
    preload takes effect when the server starts (at the first child of
    this process); later calls change nothing for a server already running,
    except the first after `start_fork_server`: a job that uses more of
    PRELOADED than that server preloads stops it (its import ran beside
    the main process's, so the job starts no later than it would have) and
    its first child starts one that preloads them too, so that no child
    imports them on its own.
    """
    global _early_preload
    context = multiprocessing.get_context("forkserver")
    guessed = early_preload(document)
    wanted = [name for name in PRELOADED if name in sys.modules or name in guessed]
    if _early_preload and not set(wanted) <= set(_early_preload):
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]  # not in typeshed
    _early_preload = ()
    context.set_forkserver_preload([*wanted, FREEZE_PRELOADED])
    return context


def _stop_fork_server() -> None:
    """At exit: stop this process's fork server, if it started one, and wait for it (at most STOP_WAIT_S).

    A waited-for server's CPU, and that of the children it forked and
    waited for, counts among this process's children (getrusage), as a
    spawned child's did: what rnb.tune.cores counts as a job's own CPU.
    A server started early that no child has used
    (a config that failed its checks, a job sent to Ray) is killed first:
    waiting would only let it finish importing torch for nobody; so is
    the server of a command that a stop ends.
    """
    # A command ending by a stop (Ctrl-C, SIGTERM) leaves at once: a server still importing would hold it for seconds,
    # and its children (all stopped by now) die with it (PR_SET_PDEATHSIG).
    end_fork_server(kill=bool(_early_preload) or STOPS.received is not None)


def end_fork_server(kill: bool = True) -> None:
    """Stop this process's fork server (SIGKILLed first with `kill`) and wait for it, at most STOP_WAIT_S.

    A stop that cut the first children's start short (rnb.engines.stopping)
    ends the server at once: a child it was forking, which the main process
    never heard of, dies with it rather than start against a job whose
    semaphores are about to go.  multiprocessing keeps the server in a
    private global; its `_stop` is what its own tests use, and it resets
    the server so that a later child would start a new one.
    """
    server = multiprocessing.forkserver._forkserver
    pid = server._forkserver_pid  # type: ignore[attr-defined]  # not in typeshed
    if kill and pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    waiter = threading.Thread(target=server._stop, daemon=True)  # type: ignore[attr-defined]  # not in typeshed
    waiter.start()
    waiter.join(STOP_WAIT_S)


atexit.register(_stop_fork_server)  # a process that never started a server has nothing to stop: `_stop` returns


@contextlib.contextmanager
def spawning_children() -> Iterator[None]:
    """Processes started inside (the fork server, or a child spawned afresh) start with Ctrl-C and SIGTERM ignored."""
    previous = multiprocessing.spawn.get_executable()
    os.environ["RNB_CHILD_PYTHON"] = sys.executable
    multiprocessing.spawn.set_executable(str(_SPAWNED_PYTHON))
    try:
        yield
    finally:
        multiprocessing.spawn.set_executable(previous)


class InheritedFd(Protocol):
    """multiprocessing's wrapper of a descriptor passed to a child (reduction.DupFd): the child's copy is `detach()`."""

    def detach(self) -> int: ...


class Lifeline:
    """Pickles to a call of `arm` with the main process's pid, the child's stacks file (or None), environment and streams."""

    def __init__(self, stacks: str | None = None) -> None:
        self.stacks = stacks

    def __reduce__(self) -> tuple[Any, tuple[int, str | None, dict[str, str], tuple[InheritedFd | None, ...]]]:
        streams = tuple(multiprocessing.reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2))
        return arm, (os.getpid(), self.stacks, dict(os.environ), streams)


def arm(parent: int, stacks: str | None, environ: dict[str, str], streams: tuple[InheritedFd | None, ...]) -> None:
    """In the child: die with the parent; if the main process is already gone, exit now rather than work for nobody.

    Ctrl-C and SIGTERM stay ignored (children start with both ignored,
    which exec and fork keep): stopping children in order is the main
    process's business, and a Ctrl-C to the whole process group must not make
    each child print a KeyboardInterrupt traceback.  The child takes the
    main process's environment and its stdout and stderr as they were when
    it was started (`streams`, None for one that was closed).  With `stacks`, the
    child writes its threads' Python stacks there on STACKS_SIGNAL; a file
    that cannot be opened (a full log directory) only costs the stacks.
    Its timed sleeps (a model's, the client's due times, a device wait's
    polls) end within TIMER_SLACK_NS of when they are due, where Linux's
    default slack of 50 us would add about 30 us to each wake-up.
    """
    global _stacks_file
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # A thread inherits the slack of the thread that made it: set before the child makes any.
    if libc.prctl(_PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_TIMERSLACK) failed")
    if not _is_running(parent):
        os._exit(1)
    os.environ.clear()
    os.environ.update(environ)
    for fd, stream in zip((1, 2), streams):
        copy = stream.detach() if stream is not None else fd
        if copy != fd:  # a spawned child's copy is the descriptor itself, already in place
            os.dup2(copy, fd)
            os.close(copy)
    if stacks is not None:
        try:
            _stacks_file = open(stacks, "w")  # noqa: SIM115 - faulthandler writes to it until the process ends
        except OSError:
            return
        faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid: not ours any more
        return False
    return True


def run(_armed: None, target: str, *args: Any) -> None:
    """A child's entry point: `_armed` is what unpickling the Lifeline left; `target` is the real entry point."""
    load_object(target)(*args)
