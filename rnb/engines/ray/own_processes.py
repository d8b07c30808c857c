"""The processes of a Ray that a job starts for itself (its own, or a simulated cluster): started deaf to SIGTERM,
ended at once.

Ray starts its daemons (the GCS, the raylet, the agents) in the driver's
process group, with SIGINT blocked but SIGTERM not: a SIGTERM to the
command's group (kill -TERM -PGID, a container's stop) would end the GCS
under a driver that then waits a minute for it, and write no log.  So the
job's own Ray starts with SIGTERM blocked in the thread that starts it,
which its daemons inherit, and through its raylet its agents and workers:
the signal is the command's to handle (rnb.engines.stopping).  The command
then ends them itself, with SIGKILL: Ray's orderly shutdown asks with
SIGTERM and waits a second for each.  They are found as the process's
descendants once Ray has started and at the end, and by a mark in their
environment (the workers, whose raylet may be gone by then).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

OWN_RAY_MARK = "RNB_OWN_RAY"   # in the environment of every process a job's own Ray starts (but its agents)


class OwnProcesses:
    """What a job knows of the processes its own Ray started."""

    def __init__(self) -> None:
        self.before: set[int] = set()           # what this process had started before Ray (a fork server)
        self.started: list[psutil.Process] = []  # what Ray had started once it was up

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Inside, Ray starts (ray.init): what it starts is marked and deaf to SIGTERM, and noted once it is up."""
        os.environ[OWN_RAY_MARK] = f"{os.getpid()}-{time.time_ns()}"
        self.before = {process.pid for process in psutil.Process().children(recursive=True)}
        # A thread that keeps SIGTERM open, started before the block: the kernel hands it a SIGTERM meanwhile, and
        # Python runs the handler in the main thread as ever, within ray.init's current wait.
        released = threading.Event()
        threading.Thread(target=released.wait, name="sigterm-taker", daemon=True).start()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            released.set()
        self.started = self.descendants()

    def descendants(self) -> list[psutil.Process]:
        """This process's descendants that its Ray started (not what it had started before)."""
        return [process for process in psutil.Process().children(recursive=True) if process.pid not in self.before]

    def end(self) -> None:
        """SIGKILL every process the job's Ray started, those orphaned since included; what this process starts
        later no longer carries the mark."""
        kill_all([*self.started, *self.descendants(), *marked(OWN_RAY_MARK)])
        os.environ.pop(OWN_RAY_MARK, None)


def marked(key: str) -> list[psutil.Process]:
    """Every other process whose environment holds `key` as this process's does; none where it does not."""
    value = os.environ.get(key)
    if not value:
        return []
    mark = f"{key}={value}".encode()
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and mark in Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0"):
                found.append(process)
        except OSError:
            continue
    return found


def kill_all(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each process still running (not another that took its pid since): none can ignore it, so none is
    waited for here (Ray reaps its own children as it shuts down)."""
    for process in processes:
        try:
            if process.is_running():   # psutil compares the creation time: a pid taken since is another process
                process.kill()
        except psutil.Error:
            continue
