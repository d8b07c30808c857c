"""What ends a job from its driver's side when no process fails: a stall, or the maximum duration.

A process that is alive but makes no progress (a deadlock, a read that never
returns, a device that stopped answering) reports nothing, so the driver
watches progress itself, from what it already has: before the start barrier,
which processes have reported ready and the CPU time of those still starting
(importing and loading a model take CPU; a deadlock or a read that never
returns takes none); after it, each runner's progress cells
(rnb.core.progress: how many items left it, which item it holds since
when, since when it is inside its model, its slowest call) and how much
each runner's threads ran or asked to run (`demand_seconds`).

Start-up has stalled when it stood still for `stall_s` seconds: no process
became ready and none of those still starting used any CPU.  A running job
has stalled when items are waiting (some runner holds one, or one of the
local engine's queues holds some), no item has
left any step and no call has ended for `stall_s` seconds, and no runner
is working.  A runner inside its model is working while its threads
computed within the last `stall_s` seconds (demanded at least BUSY_SHARE
of a BUSY_WINDOW_S: a call computing, a GPU's host side launching), unless the call it is in has lasted SLOWEST_TIMES
times the slowest call its step completed (and at least `stall_s`).  A
runner waiting for its device polls it (rnb.core.device) and demands
little: a lock, a sleep, a read or a device that never returns leaves it
idle, and the job ends `stall_s` after the last item moved and the runner
last computed, however long the step's calls were before.  A process that spins is, as far
as the harness can tell, working: at start-up and in the first call of a
step that has completed none, for ever; later, until its call passes the
step's bound.  Both engines' drivers ask the same `JobWatch`; what they do
about a stall (ask each process for its Python stacks, then stop the job)
is theirs.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rnb.core.joblog import STACKS_DIR
from rnb.core.progress import ClientWait, ProgressSnapshot
from rnb.core.records import ProcessRecord
from rnb.engines.job import JobBook

# A call that spins past its step's bound may be a slow one, so the sentence says what to do if that is the case.
SLOW_HINT = " (a step only this slow needs a larger --stall-s)"
SAMPLE_EVERY_S = 0.25   # how often the runners' demand is read (about 0.15 ms a thread, on the loaded 2-core machine)
BUSY_WINDOW_S = 1.0     # the demand that says a runner is computing is over this long
BUSY_SHARE = 0.5        # of BUSY_WINDOW_S: a computing thread demands all of it, a runner waiting on its device about
                        # 0.05 and an idle one under 0.03, with blips to 0.25 over a quarter second (load average 13 to
                        # 30 on 2 cores)
SLOWEST_TIMES = 5       # how many times its step's slowest completed call a working call may last


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
        self._sampled = -float("inf")   # when the runners' demand was last read
        self._demand: dict[str, deque[tuple[float, float]]] = {}   # each runner's (time, demand_seconds) samples
        self._busy_at: dict[str, float] = {}                  # when each runner was last seen computing
        self._quiet_since: float | None = None   # since when nothing has waited in the pipeline, while nothing has

    def _moved(self, count: object, now: float) -> None:
        if count != self._count:
            self._count, self._since = count, now

    def start_up(self, book: JobBook, cpu_s: Mapping[str, float], now: float) -> Stall | None:
        """Before the start barrier: stalled when, for stall_s, no process became ready and none still starting
        used CPU (`cpu_s`: the CPU seconds so far of the processes it can see; those ready do not count)."""
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

    def running(self, progress: Mapping[str, ProgressSnapshot], demand_s: Callable[[], Mapping[str, float]],
                book: JobBook, now: float, queued: Mapping[int, int] | None = None,
                client: ClientWait | None = None) -> Stall | None:
        """After the start: stalled when items wait (a runner holds one, or `queued`, by step, says how many wait in
        each step's input queues), no item has left any step for stall_s, and no runner is working (`demand_s`:
        each runner process's demand_seconds so far, asked every SAMPLE_EVERY_S); or at once when every runner of
        a step for which items wait has been inside one call for stall_s without working, whatever the other
        steps still move; or when nothing waits and the client has had nothing to send for stall_s (`client`).

        Items queued count as waiting too: a step whose calls hang while the
        step before it had room to hand on every item holds none itself.
        """
        if self.stall_s is None:
            return None
        self._moved(sum(p.left + p.calls for p in progress.values()), now)   # an item leaving, or a call ending
        if now - self._sampled >= SAMPLE_EVERY_S:
            self._sample(demand_s(), now)
        queued = {step: count for step, count in (queued or {}).items() if count}
        held = [p.held_since for p in progress.values() if p.held_item is not None and p.held_since is not None]
        if not held and not queued:
            self._since = now   # nothing waits: a quiet pipeline has not stalled, unless its load stopped coming
            self._quiet_since = self._quiet_since or now
            return self._client_idle(client, book, now, self.stall_s)
        self._quiet_since = None
        verdicts = {name: self._verdict(name, p, progress, book, now, self.stall_s) for name, p in progress.items()
                    if p.calling_since is not None}
        idle = {name: why for name, why in verdicts.items() if why is not None}
        stuck = stuck_step(progress, book, now, idle, queued, self.stall_s)
        if stuck is not None:   # every runner of a step items wait for is stuck: what the others move cannot finish
            return blame({name: p for name, p in progress.items() if book[name].step == stuck}, book, now, idle, queued)
        if now - max(self._since, min(held, default=self._since)) < self.stall_s:
            return None
        if len(idle) < len(verdicts):   # a runner is working: the others wait for it
            return None
        return blame(progress, book, now, idle, queued)

    def _client_idle(self, client: ClientWait | None, book: JobBook, now: float, stall_s: float) -> Stall | None:
        """Nothing waits in the pipeline and the client has had nothing to send for stall_s: its next request falls
        due so late that the job would sit idle (a trace's gap, a sparse schedule)."""
        if client is None or self._quiet_since is None or now - max(client.since, self._quiet_since) < stall_s:
            return None
        start = self._start if self._start is not None else self._began
        return Stall("client", f"{describe(book['client'], book)} has had nothing to send for {now - client.since:.1f} "
                               f"s with every request sent so far finished: request {client.item} is due "
                               f"{client.due - start:.1f} s after the start, {client.due - now:.1f} s from now "
                               "(a load this sparse needs a larger --stall-s)")

    def _sample(self, demand_s: Mapping[str, float], now: float) -> None:
        """Note which runners are computing: those that demanded BUSY_SHARE of the last BUSY_WINDOW_S (or more)."""
        self._sampled = now
        for name, demand in demand_s.items():
            samples = self._demand.setdefault(name, deque())
            samples.append((now, demand))
            while len(samples) > 2 and samples[1][0] <= now - BUSY_WINDOW_S:
                samples.popleft()
            then, before = samples[0]
            if now - then >= BUSY_WINDOW_S and demand - before >= BUSY_SHARE * (now - then):
                self._busy_at[name] = now

    def _verdict(self, name: str, runner: ProgressSnapshot, progress: Mapping[str, ProgressSnapshot], book: JobBook,
                 now: float, stall_s: float) -> str | None:
        """None while a runner inside its model is working (it computed within stall_s, and its call has not passed
        its step's bound); else why it is not, as the end of a sentence."""
        busy_at = self._busy_at.get(name)
        if busy_at is None or now - busy_at >= stall_s:
            since = "since the job started" if busy_at is None else f"for {now - busy_at:.1f} s"
            return f", and its process has not computed {since}"
        slowest = max(slowest_calls(name, progress, book), default=None)
        calling = runner.calling_since
        assert calling is not None
        if slowest is not None and now - calling >= max(stall_s, SLOWEST_TIMES * slowest):
            return (f", inside one call for {now - calling:.1f} s, over {SLOWEST_TIMES} times "
                    f"the slowest its step completed ({slowest:.2f} s){SLOW_HINT}")
        return None


@dataclass(frozen=True)
class Look:
    """What a driver learns of one process when it looks (the Ray engine asks each actor for it)."""

    progress: ProgressSnapshot | None   # a runner's progress; None for the client
    cpu_s: float                        # CPU seconds its loop's thread has used (start-up's progress)
    demand_s: float = 0.0               # demand_seconds of its loop's thread and those started since (torch's), not Ray's
    client: ClientWait | None = None    # the client's wait for its next request's due time, if it waits


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User plus system CPU seconds of a process (all its threads), or of one of its threads, from /proc; 0 once gone."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(stat).read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def slowest_calls(name: str, progress: Mapping[str, ProgressSnapshot], book: JobBook) -> Iterable[float]:
    """The slowest completed call of each runner of `name`'s step that has completed one."""
    step = book[name].step
    return (p.slowest_call_s for other, p in progress.items()
            if p.slowest_call_s is not None and book[other].step == step)


def demand_seconds(pid: int, leaving_out: Collection[int] = ()) -> float:
    """The seconds a process's threads (those alive, but `leaving_out`'s native ids) ran on a CPU or waited, runnable,
    for one, from /proc schedstat; 0 once gone.

    This, not CPU time, tells computing from waiting on a loaded machine: a
    thread that computes demands about a second each second however little
    of it the scheduler grants (18 % of a core at a load average of 50 on
    this 2-core machine), one that waits on a lock, a timer or a read none.
    """
    try:
        threads = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return 0.0
    total_ns = 0
    for thread in threads:
        if thread in leaving_out:
            continue
        try:
            running_ns, waiting_ns, _ = Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # gone since the listing
        total_ns += int(running_ns) + int(waiting_ns)
    return total_ns / 1e9


def stuck_step(progress: Mapping[str, ProgressSnapshot], book: JobBook, now: float, idle: Mapping[str, str],
               queued: Mapping[int, int], stall_s: float) -> int | None:
    """A step for which items wait (its runners hold some, or its input queue does) whose every runner has been inside
    one call for stall_s and is not working (`idle`: their verdicts); None if there is none.  The items cannot get
    past it, so nothing the other steps still move finishes one: the stall dates from its calls, not from them."""
    by_step: dict[int, list[str]] = {}
    for name in progress:
        step = book[name].step
        if step is not None:
            by_step.setdefault(step, []).append(name)
    for step, names in sorted(by_step.items()):
        calls = [progress[name].calling_since for name in names]
        waiting = queued.get(step, 0) or any(progress[name].held_item is not None for name in names)
        if waiting and all(name in idle for name in names) and all(
                since is not None and now - since >= stall_s for since in calls):
            return step
    return None


def blame(progress: Mapping[str, ProgressSnapshot], book: JobBook, now: float, verdicts: Mapping[str, str],
          queued: Mapping[int, int]) -> Stall:
    """The runner a stall is put on: the one inside its model the longest (those that only hold items the next
    step does not take are waiting on it), else the one holding the oldest item, else the first of the first step
    whose input queue holds items (`queued`, by step); `verdicts` say why each runner inside its model is not
    working."""
    calling = [(name, p) for name, p in progress.items() if p.calling_since is not None]
    held = [(name, p) for name, p in progress.items() if p.held_since is not None]
    if not calling and not held:
        step = min(queued)
        name = min(other for other in progress if book[other].step == step)
        return Stall(name, f"{queued[step]} items have waited in step {step}'s input queue with no item finished and "
                           f"no runner of step {step} taking one, {describe(book[name], book)} among them")
    name, stuck = min(calling or held, key=lambda entry: (entry[1].calling_since if calling else entry[1].held_since) or 0.0)
    who = describe(book[name], book)
    why = verdicts.get(name, SLOW_HINT)
    its_step = book[name].step
    waiting = queued.get(its_step) if its_step is not None else None
    since = f"since and {waiting} items in its input queue" if waiting else "since"
    if stuck.held_item is not None and stuck.held_since is not None:
        return Stall(name, f"{who} has held item {stuck.held_item} for {now - stuck.held_since:.1f} s with no item "
                           f"finished {since}{why}")
    assert stuck.calling_since is not None
    return Stall(name, f"{who} has been inside its model for {now - stuck.calling_since:.1f} s with no item finished "
                       f"{since}{why}")


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
