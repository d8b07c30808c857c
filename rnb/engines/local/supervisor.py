"""The main process's watch over its children: spawn, listen, notice deaths, stop.

Nothing here can block the main thread on anything a child holds: children
→ main queues are read on threads (rnb.engines.local.inbox), the flag and the
start gate take no lock, and stopping ends in SIGKILL and join.  A child that
dies at any moment (at start-up, mid-run, holding any lock, half way through
a message) is noticed within a fraction of a second, no job hangs and no
child outlives it.

Children are spawned with Ctrl-C and SIGTERM ignored and tied to the main
process's life (rnb.engines.local.lifeline): the main process alone decides when
they stop.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from rnb.core.progress import Progress, ProgressSnapshot
from rnb.core.records import ProcessRecord
from rnb.core.termination import POLL_S, Termination
from rnb.engines.job import JobBook
from rnb.engines.local.inbox import Inbox
from rnb.engines.local.lifeline import STACKS_SIGNAL, Lifeline, run, spawning_children
from rnb.engines.local.plumbing import Plumbing
from rnb.engines.spool import TimingsSpool
from rnb.engines.stall import cpu_seconds, demand_seconds, stacks_file

# multiprocessing.forkserver's refusal of a child whose arguments hold more than about 250 file descriptors (a
# runner reading the shared slots of many producers): that child is spawned afresh instead, importing for itself.
FORK_SERVER_FD_REFUSAL = "too many fds"
# How long the main process waits for the children it asked to write their stacks (faulthandler writes at once).
STACKS_WAIT_S = 1.0


@dataclass
class Child:
    name: str
    process: BaseProcess
    stopped_by_main: bool = False


@dataclass
class Supervisor:
    plumbing: Plumbing
    spool: TimingsSpool             # where finished items' time cards go
    book: JobBook = field(default_factory=JobBook)
    children: list[Child] = field(default_factory=list)
    inboxes: dict[str, Inbox] = field(default_factory=dict)
    progress: dict[str, Progress] = field(default_factory=dict)   # each runner's cells, by name

    def spawn(self, ctx: ForkServerContext, target: Callable[..., None], args: tuple[object, ...],
              record: ProcessRecord) -> None:
        """Start `target(*args)` in a new process, tied to this one's life; `record` says what it is."""
        entry = f"{target.__module__}.{target.__qualname__}"
        stacks: str | None = str(stacks_file(self.spool.job_dir, record.name))
        try:
            stacks_file(self.spool.job_dir, record.name).parent.mkdir(exist_ok=True)
        except OSError:  # a log directory that cannot take it costs only the stacks
            stacks = None
        arguments = (Lifeline(stacks), entry, *args)
        process: BaseProcess = ctx.Process(target=run, args=arguments, name=record.name, daemon=True)
        with spawning_children():
            try:
                process.start()
            except ValueError as error:
                if str(error) != FORK_SERVER_FD_REFUSAL:
                    raise
                # Its arguments hold more descriptors (shared slots) than the fork server takes in one message.
                process = multiprocessing.get_context("spawn").Process(target=run, args=arguments, name=record.name,
                                                                       daemon=True)
                process.start()
        self.children.append(Child(record.name, process))
        self.book.add(dataclasses.replace(record, pid=process.pid))

    def alive(self) -> list[Child]:
        return [child for child in self.children if self.book[child.name].exitcode is None]

    def pump(self, timeout: float = POLL_S) -> None:
        """Take in what children sent, then account for any that exited."""
        if not self.inboxes:
            self.inboxes = {"status": Inbox(self.plumbing.status, "status"),
                            "results": Inbox(self.plumbing.results, "results")}
        now = time.monotonic()
        exited = [(child, child.process.exitcode) for child in self.alive() if child.process.exitcode is not None]
        if exited:
            # A child's messages are in the pipe before it exits: once the readers found the pipes empty
            # after now, its last words are in.
            for inbox in self.inboxes.values():
                inbox.settle(since=now)
        self._drain(timeout if not exited else 0.0)
        for child, code in exited:
            self._exited(child, code)

    def progress_now(self) -> dict[str, ProgressSnapshot]:
        """Each runner's progress as its cells read now."""
        return {name: cells.read() for name, cells in self.progress.items()}

    def cpu_of_starting(self) -> dict[str, float]:
        """The CPU seconds so far of each live child that has not reported ready (start-up's progress)."""
        return {child.name: cpu_seconds(child.process.pid) for child in self.alive()
                if child.name not in self.book.ready and child.process.pid is not None}

    def demand_of_children(self) -> dict[str, float]:
        """How long each live child's threads have run or waited to run (rnb.engines.stall.demand_seconds)."""
        return {child.name: demand_seconds(child.process.pid) for child in self.alive() if child.process.pid is not None}

    def ask_for_stacks(self) -> None:
        """Have every live child write its Python stacks to its file (STACKS_SIGNAL), and wait until they have.

        Only children whose file exists are asked: one that has not yet armed
        its handler would take the signal's default, which ends the process.
        """
        asked = []
        for child in self.alive():
            path = stacks_file(self.spool.job_dir, child.name)
            if child.process.pid is not None and path.exists():
                try:
                    os.kill(child.process.pid, STACKS_SIGNAL)
                    asked.append(path)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and not all(_written(path) for path in asked):
            time.sleep(0.01)
        time.sleep(0.02)  # each handler writes all its threads at once; let the last ones end theirs

    def kill_all(self) -> None:
        """Stop every child now (a job stopped while they start: none has measured anything)."""
        self._kill(self.alive())

    def kill(self, name: str) -> None:
        """Stop one child now (a stalled one, whose stacks are taken): it cannot leave on its own."""
        self._kill([child for child in self.alive() if child.name == name])

    def _drain(self, timeout: float) -> None:
        status = self.inboxes["status"]
        try:
            self.book.on_status(status.get(timeout))
        except queue.Empty:
            pass
        for message in status.take_all():
            self.book.on_status(message)
        for results in self.inboxes["results"].take_all():
            self.spool.add(results.cards)

    def _exited(self, child: Child, code: int) -> None:
        record = self.book.update(child.name, exitcode=code)
        if record.status is not None:
            return
        if code == 0:
            self.book.update(child.name, status="ok")
        elif child.stopped_by_main:
            self.book.update(child.name, status="killed")
        else:
            error = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
            self.book.update(child.name, status="failed", error=error)
            # take_over: the child may have died holding the flag's token, mid-raise.
            if self.plumbing.flag.take_over(Termination.PROCESS_FAILED) or (
                    self.plumbing.flag.reason == Termination.PROCESS_FAILED):
                self.book.first_failure(child.name, error)

    def stop(self, grace_s: float = 4.0, starting_grace_s: float = 1.0, kill_after_s: float = 2.0) -> None:
        """Let children leave on their own, then kill them (they ignore SIGTERM); always joins them all.

        A child that never reported ready (still importing or loading its
        model) has nothing measured to flush: it gets `starting_grace_s`, time
        enough to send a failure it is reporting, not the full `grace_s`.
        """
        began = time.time()
        while self.alive() and time.time() < began + grace_s:
            self.pump()
            if time.time() >= began + starting_grace_s:
                self._kill([child for child in self.alive() if child.name not in self.book.ready])
        self._kill(self.alive())
        deadline = time.time() + kill_after_s
        while self.alive() and time.time() < deadline:
            self.pump()
        for child in self.children:
            child.process.join(timeout=1.0)
        self.pump(0.0)
        for child in self.alive():  # unkillable (e.g. stuck in the kernel): say so rather than wait
            self.book.update(child.name, status="killed", error="did not exit after SIGKILL")
        for inbox in self.inboxes.values():
            inbox.close()
        self._drain(0.0)
        for inbox in self.inboxes.values():
            if inbox.stuck or inbox.broken:
                self.book.notes.append(f"the {inbox.name} queue was left cut short by a process that died writing to it "
                                  "(what was sent after that was lost)")
        for ring in self.plumbing.rings:
            if ring.recoveries:
                self.book.notes.append(f"a lock of the {ring.name} was taken over {ring.recoveries} times from a process "
                                       "that died holding it (a reader that died so took at most its one message with it)")

    def _kill(self, children: list[Child]) -> None:
        for child in children:
            if not child.stopped_by_main:
                child.stopped_by_main = True
                child.process.kill()


def _written(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return True  # gone: nothing to wait for

