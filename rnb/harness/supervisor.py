"""The main process's watch over its children: spawn, listen, notice deaths, stop.

Nothing here blocks for longer than a poll interval, so a child that dies at
any moment (at start-up, mid-run, even while holding a queue lock) is noticed
within a fraction of a second, and stopping always ends in terminate, then
kill, then join: no job hangs and no child outlives it.
"""
from __future__ import annotations

import dataclasses
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rnb.harness.control import POLL_S, Plumbing, Termination
from rnb.harness.joblog import process_record
from rnb.harness.messages import Exited, Failed, Ready, Status
from rnb.harness.timecard import TimeCard


@dataclass
class Child:
    process: Any
    record: dict[str, Any]          # its meta.json `processes` entry, filled in as it goes
    stopped_by_main: bool = False


@dataclass
class Supervisor:
    plumbing: Plumbing
    children: list[Child] = field(default_factory=list)
    cards: list[TimeCard] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    failure: tuple[str, str] | None = None   # (process name, error) of the first failure

    def spawn(self, ctx: Any, target: Callable, args: tuple, name: str, role: str, step: int | None = None,
              group: int | None = None, instance: int | None = None, device: str | None = None) -> None:
        process = ctx.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        self.children.append(Child(process, process_record(name, role, step, group, instance, device, process.pid)))

    def alive(self) -> list[Child]:
        return [child for child in self.children if child.record["exitcode"] is None]

    def pump(self, timeout: float = POLL_S) -> None:
        """Take in what children sent, then account for any that exited."""
        exited = [(child, child.process.exitcode) for child in self.alive() if child.process.exitcode is not None]
        # Messages a child sent are in the pipe before it exits, so draining now catches its last words.
        self._drain(timeout if not exited else 0.0)
        for child, code in exited:
            self._exited(child, code)

    def _drain(self, timeout: float) -> None:
        try:
            self._on_status(self.plumbing.status.get(timeout=timeout) if timeout else self.plumbing.status.get_nowait())
            while True:
                self._on_status(self.plumbing.status.get_nowait())
        except queue.Empty:
            pass
        try:
            while True:
                self.cards.extend(self.plumbing.results.get_nowait().cards)
        except queue.Empty:
            pass

    def _on_status(self, message: Status) -> None:
        record = next(child.record for child in self.children if child.record["name"] == message.name)
        if isinstance(message, Ready):
            self.ready.add(message.name)
            self.notes.extend(note for note in message.notes if note not in self.notes)
        elif isinstance(message, Failed):
            record["status"], record["error"] = "failed", message.error
            if self.failure is None:
                self.failure = (message.name, message.error)
        elif isinstance(message, Exited):
            record.update(dataclasses.asdict(message))

    def _exited(self, child: Child, code: int) -> None:
        record = child.record
        record["exitcode"] = code
        if record["status"] is not None:
            return
        if code == 0:
            record["status"] = "ok"
        elif child.stopped_by_main:
            record["status"] = "killed"
        else:
            record["status"] = "failed"
            record["error"] = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
            if self.plumbing.flag.raise_(Termination.PROCESS_FAILED) or (
                    self.failure is None and self.plumbing.flag.reason == Termination.PROCESS_FAILED):
                self.failure = (record["name"], record["error"])

    def stop(self, grace_s: float = 4.0, kill_after_s: float = 2.0) -> None:
        """Let children leave on their own, then terminate, then kill; always joins them all."""
        deadline = time.time() + grace_s
        while self.alive() and time.time() < deadline:
            self.pump()
        for signal_them in ("terminate", "kill"):
            for child in self.alive():
                child.stopped_by_main = True
                getattr(child.process, signal_them)()
            deadline = time.time() + kill_after_s
            while self.alive() and time.time() < deadline:
                self.pump()
        for child in self.children:
            child.process.join(timeout=1.0)
        self.pump(0.0)
        for child in self.alive():  # unkillable (e.g. stuck in the kernel): say so rather than wait
            child.record.update(status="killed", error="did not exit after SIGKILL")
