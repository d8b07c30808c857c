"""What ends a job from its driver's side when no process fails: a stall, or the maximum duration.

A process that is alive but makes no progress (a deadlock, a read that never
returns, a device that stopped answering) reports nothing, so the driver
watches progress itself, from what it already has: before the start barrier,
which processes have reported ready and the CPU time of those still starting
(importing and loading a model take CPU; a deadlock or a read that never
returns takes none); after it, each runner's progress cells
(rnb.core.progress: how many items left it, and which item it holds since
when).  The job has stalled when items are waiting (some runner holds one)
and no item has left any step for `stall_s` seconds, or when start-up has
stood still that long: no process became ready and none of those still
starting used any CPU.  A process that spins at start-up is, as far as the
harness can tell, working.  Both engines' drivers
ask the same `JobWatch`; what they do about a stall (ask each process for its
Python stacks, then stop the job) is theirs.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rnb.core.joblog import STACKS_DIR
from rnb.core.progress import ProgressSnapshot
from rnb.core.records import ProcessRecord
from rnb.engines.job import JobBook

# A step that is slow but alive reads the same as a stuck one from outside (a GPU's synchronise spins like a busy
# loop), so the sentence says what to do if that is the case.
SLOW_HINT = " (a step only this slow needs a larger --stall-s)"


@dataclass(frozen=True)
class Stall:
    """The process a stall is blamed on, and what it was doing, as one sentence."""

    process: str
    sentence: str


class JobWatch:
    """Decides when a running job has stalled or run its maximum duration; None for either turns it off."""

    def __init__(self, stall_s: float | None, max_duration_s: float | None, now: float) -> None:
        self.stall_s = stall_s or None
        self.max_duration_s = max_duration_s or None
        self._began = now            # start-up began
        self._start: float | None = None
        self._count: object = None
        self._since = now            # when the count last moved, or when the watch last saw nothing waiting

    def _moved(self, count: object, now: float) -> None:
        if count != self._count:
            self._count, self._since = count, now

    def start_up(self, book: JobBook, cpu_s: Mapping[str, float], now: float) -> Stall | None:
        """Before the start barrier: stalled when, for stall_s, no process became ready and none still starting
        used CPU (`cpu_s`: the CPU seconds so far of the processes not yet ready, those it can see)."""
        waiting = [record for record in book.records if record.name not in book.ready and record.status is None]
        self._moved((len(book.ready), sum(cpu_s.get(record.name, 0.0) for record in waiting)), now)
        if self.stall_s is None or now - self._since < self.stall_s or not waiting:
            return None
        others = f" (nor have {len(waiting) - 1} other processes)" if len(waiting) > 1 else ""
        return Stall(waiting[0].name, f"{describe(waiting[0], book)} has not become ready {now - self._began:.1f} s "
                                      f"after start-up began{others}, and no process starting has used any CPU for "
                                      f"{now - self._since:.1f} s")

    def started(self, start: float) -> None:
        """The start barrier passed at `start`: from now on progress is items leaving steps."""
        self._start, self._count, self._since = start, None, start

    def deadline(self) -> float | None:
        """When the maximum duration ends the job (epoch seconds), if it has one and has started."""
        return None if self.max_duration_s is None or self._start is None else self._start + self.max_duration_s

    def over_time(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def running(self, progress: Mapping[str, ProgressSnapshot], book: JobBook, now: float) -> Stall | None:
        """After the start: stalled when some runner holds an item and no item has left any step for stall_s."""
        self._moved(sum(p.left for p in progress.values()), now)
        held = [(name, p) for name, p in progress.items() if p.held_item is not None and p.held_since is not None]
        if not held:
            self._since = now   # nothing waits: a quiet pipeline has not stalled
            return None
        _, oldest = min(held, key=lambda entry: entry[1].held_since or 0.0)
        assert oldest.held_since is not None
        if self.stall_s is None or now - max(self._since, oldest.held_since) < self.stall_s:
            return None
        return blame(progress, book, now)


@dataclass(frozen=True)
class Look:
    """What a driver learns of one process when it looks (the Ray engine asks each actor for it)."""

    progress: ProgressSnapshot | None   # a runner's progress; None for the client
    cpu_s: float                        # CPU seconds its loop's thread has used (start-up's progress)


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User plus system CPU seconds of a process (all its threads), or of one of its threads, from /proc; 0 once gone."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(stat).read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def blame(progress: Mapping[str, ProgressSnapshot], book: JobBook, now: float) -> Stall:
    """The runner a stall is put on: the one inside its model the longest (those that only hold items the next
    step does not take are waiting on it), else the one holding the oldest item."""
    calling = [(name, p) for name, p in progress.items() if p.calling_since is not None]
    held = [(name, p) for name, p in progress.items() if p.held_since is not None]
    name, stuck = min(calling or held, key=lambda entry: (entry[1].calling_since if calling else entry[1].held_since) or 0.0)
    who = describe(book[name], book)
    if stuck.held_item is not None and stuck.held_since is not None:
        return Stall(name, f"{who} has held item {stuck.held_item} for {now - stuck.held_since:.1f} s with no item "
                           f"finished since{SLOW_HINT}")
    assert stuck.calling_since is not None
    return Stall(name, f"{who} has been inside its model for {now - stuck.calling_since:.1f} s with no item finished "
                       f"since{SLOW_HINT}")


def describe(record: ProcessRecord, book: JobBook) -> str:
    """A process as a user finds it: "step 1 replica 0 (pid 1234, cpu)", "the client (pid 1200)"."""
    where = ", ".join(str(part) for part in (f"pid {record.pid}" if record.pid is not None else None,
                                              f"on {record.node_ip}" if record.node_ip else None, record.device)
                      if part)
    if record.role == "client":
        return f"the client ({where})" if where else "the client"
    groups = {r.group for r in book.records if r.role == "runner" and r.step == record.step}
    group = f" group {record.group}" if len(groups) > 1 else ""
    return f"step {record.step}{group} replica {record.instance} ({where})"


def stacks_file(job_dir: Path, name: str) -> Path:
    """Where process `name`'s Python stacks go when the job stalls."""
    return job_dir / STACKS_DIR / f"{name}.txt"


def kept_stacks(job_dir: Path) -> dict[str, str]:
    """The stack files that hold something, by process name (paths relative to the job directory); empty ones removed.

    On the local engine every child opens its file when it starts (faulthandler
    writes to it from its signal handler), so a job that never stalled leaves
    only empty files, and no stacks directory once they are gone.
    """
    folder = job_dir / STACKS_DIR
    kept: dict[str, str] = {}
    if not folder.is_dir():
        return kept
    for path in sorted(folder.glob("*.txt")):
        try:
            if path.stat().st_size:
                kept[path.stem] = f"{STACKS_DIR}/{path.name}"
            else:
                path.unlink()
        except OSError:
            continue
    try:
        folder.rmdir()  # only when empty
    except OSError:
        pass
    return kept


def stall_error(stall: Stall, job_dir: Path, stacks: Mapping[str, str]) -> str:
    """The job's one error sentence for a stall: who held what for how long, and where the stacks are."""
    if not stacks:
        return stall.sentence
    own = f" ({stacks[stall.process].rpartition('/')[2]} is its own)" if stall.process in stacks else ""
    return f"{stall.sentence}; the Python stacks of every process are in {job_dir / STACKS_DIR}/{own}"
