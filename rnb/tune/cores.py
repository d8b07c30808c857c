"""The host's cores: how many a job may use, and how processor sharing divides them among the work on them.

`os.cpu_count()` counts the machine's CPUs, not what this process may use:
a container's cgroup quota (cpu.max, or cpu.cfs_quota_us under cgroup v1)
and the affinity mask both lower it.  The tuner records what it found with
every profile and models the host with it.
"""
from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

Result = TypeVar("Result")

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


@dataclass(frozen=True)
class HostCores:
    """What bounds this process's CPU: the CPUs it may run on, and its cgroup's quota."""

    affinity: int            # CPUs in os.sched_getaffinity(0)
    quota: float | None      # the cgroup's quota in cores; None where it sets none

    @property
    def usable(self) -> float:
        """Cores the host's work can use at once: the fewer of the two bounds."""
        return float(self.affinity) if self.quota is None else min(float(self.affinity), self.quota)

    def describe(self) -> str:
        cores = self.usable
        return f"{cores:g} core{'' if cores == 1 else 's'}"


def quota_cores(cpu_max: str) -> float | None:
    """Cores a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD") allows; None when unlimited."""
    fields = cpu_max.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return int(fields[0]) / int(fields[1])


def _cgroup_quota(v2: Path, v1: Path) -> float | None:
    try:
        if v2.is_file():
            return quota_cores(v2.read_text())
        quota = int((v1 / "cpu.cfs_quota_us").read_text())
        period = int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def host_cores(v2: Path = CGROUP_V2_CPU_MAX, v1: Path = CGROUP_V1_CPU) -> HostCores:
    """This host's cores as this process sees them (the tuner's children inherit both bounds)."""
    return HostCores(len(os.sched_getaffinity(0)), _cgroup_quota(v2, v1))


def _ours_s() -> float:
    """CPU seconds of this process and of every descendant that it, or they, waited for."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


def _host_s() -> float:
    """CPU seconds the host's cores have been busy (every process's), from /proc/stat."""
    times = psutil.cpu_times()
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


def with_others(action: Callable[[], Result]) -> tuple[Result, float]:
    """What `action` returned, and the cores other work on the host used on average meanwhile.

    Other work is the host's busy CPU less this process's and its waited-for
    descendants': `action` must wait for every process it starts (a
    benchmark job does), or their CPU counts as another's.
    """
    started, host, ours = time.monotonic(), _host_s(), _ours_s()
    result = action()
    others = (_host_s() - host) - (_ours_s() - ours)
    return result, max(0.0, others) / max(time.monotonic() - started, 1e-9)


def shares(caps: Sequence[float], cores: float) -> list[float]:
    """Processor sharing: the cores each task runs on at once, where task i can use at most caps[i].

    Every task gets an equal share; a task that cannot use all of its share
    (fewer threads) leaves the rest to the others (water-filling).  With
    enough cores every task runs at its cap.
    """
    rates = [0.0] * len(caps)
    left = cores
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    for position, i in enumerate(order):
        share = left / (len(order) - position)
        rates[i] = min(caps[i], share)
        left -= rates[i]
    return rates


FINISHED_S = 1e-9   # core-seconds of work left that count as none (what float rounding leaves of a finished task)


class _Task:
    __slots__ = ("work", "cap", "rate", "done")

    def __init__(self, work: float, cap: float, done: Callable[[], None]) -> None:
        self.work = work      # core-seconds left
        self.cap = cap        # the most cores it runs on at once (its threads)
        self.rate = 0.0       # the cores it runs on now
        self.done = done


class SharedCores:
    """A host's cores shared by processor sharing among the tasks on them, inside an event simulation.

    A task is CPU work of a known number of core-seconds; while more work
    runs than the host has cores, every task runs slower (`shares`), so a
    call's wall time stretches.  A backlog (`queue`) is a process that does
    its work one piece after another on one core: the client and main.
    `schedule(when, action)` and `clock()` are the simulation's.
    """

    def __init__(self, cores: float, schedule: Callable[[float, Callable[[], None]], None],
                 clock: Callable[[], float]) -> None:
        self.cores = cores
        self.schedule = schedule
        self.clock = clock
        self.tasks: list[_Task] = []
        self.backlogs: dict[str, _Task] = {}
        self.last = 0.0
        self.used_s = 0.0     # core-seconds spent so far
        self.turn = 0         # invalidates a completion scheduled before the shares last changed

    def run(self, work_s: float, cap: float, done: Callable[[], None]) -> None:
        """Start `work_s` core-seconds on at most `cap` cores; `done()` when they are spent."""
        self._advance()
        self.tasks.append(_Task(work_s, cap, done))
        self._reshare()

    def queue(self, backlog: str, work_s: float) -> None:
        """Add work to a one-core process's backlog (it runs while it has any)."""
        task = self.backlogs.get(backlog)
        if task is None:
            self.backlogs[backlog] = task = _Task(0.0, 1.0, lambda: self._idle(backlog))
            self.tasks.append(task)
        self._advance()
        task.work += work_s
        self._reshare()

    def _idle(self, backlog: str) -> None:
        del self.backlogs[backlog]

    def _advance(self) -> None:
        now = self.clock()
        elapsed = now - self.last
        self.last = now
        if elapsed > 0:
            for task in self.tasks:
                task.work -= task.rate * elapsed
                self.used_s += task.rate * elapsed

    def _reshare(self) -> None:
        self.turn += 1
        if not self.tasks:
            return
        for task, rate in zip(self.tasks, shares([task.cap for task in self.tasks], self.cores)):
            task.rate = rate
        soonest = min(max(0.0, task.work) / task.rate for task in self.tasks)
        turn = self.turn
        self.schedule(self.last + soonest, lambda: self._finish(turn))

    def _finish(self, turn: int) -> None:
        if turn != self.turn:
            return
        self._advance()
        finished = [task for task in self.tasks if task.work <= FINISHED_S]
        self.tasks = [task for task in self.tasks if task.work > FINISHED_S]
        self._reshare()
        for task in finished:
            task.done()


def saturated(busy_fraction: float) -> bool:
    """Whether the host's cores were busy enough that more work on them cannot add throughput."""
    return busy_fraction >= 0.9 and not math.isnan(busy_fraction)
