"""The Ray engine's driver: one job on a Ray cluster, with the local engine's barriers, timing and log.

    run_ray_job ── connects (rnb.engines.ray.cluster), seats the runners (rnb.engines.ray.placement),
      │            reserves and checks GPUs (rnb.engines.ray.gpu_bundles: a Reservation), opens the log,
      │            makes the Crew (rnb.engines.ray.crew: the JobControl, then the actors as RayJob launches them)
      ▼
    JobControl ◀── Ready, Failed, Exited, finished cards ── client actor, runner actors
      │
    driver: every actor ready -> clock offsets per node -> start; flag raised -> halt, kill, log

The start time is taken when every actor has reported ready, the end time is
the JobControl's flag (at the target, when the final step counted the last
item it accepted); both on the driver's clock, on which every time card is
stamped too (each actor shifts its stamps by its node's measured offset,
rnb.engines.ray.clock).  A failed or lost actor ends the job within a poll
interval of Ray noticing; whatever way the job ends, every actor it created
is killed and its placement group removed.  The driver looks at every actor
a few times a second (its progress and its loop's CPU: rnb.engines.stall),
so a job that stalls or runs its maximum duration ends as on the local engine.
Each phase is a value the next one is made from (Reservation, then Crew,
then RayJob with the job's JobLife, rnb.engines.lifecycle), so nothing
the driver holds waits as None for a later phase to set it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from rnb.core.termination import POLL_S, Termination
from rnb.engines.job import JobBook, JobEnding, JobResult, RunArgs, close_job, open_job_dir
from rnb.engines.lifecycle import JobLife
from rnb.engines.ray.clock import ClockOffset, measure_offset
from rnb.engines.ray.cluster import JobRay, NodeInfo
from rnb.engines.ray.control import ControlState
from rnb.engines.ray.crew import Crew, Member
from rnb.engines.ray.gpu_bundles import Reservation, reserve_gpus
from rnb.engines.ray.placement import Seat, seat_runners
from rnb.engines.stall import Stall, stacks_file
from rnb.engines.stopping import STOPS
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.dataset_source import KINDS
from rnb.pipeline.gpus import busy_notes
from rnb.pipeline.plan import Placement

log = logging.getLogger(__name__)

GRACE_S = 4.0             # how long halted actors get to finish on their own before they are killed
STALLED_GRACE_S = 1.0     # ... when the job stalled: those not stuck leave within a poll interval
STOPPED_GRACE_S = 1.0     # ... when Ctrl-C or SIGTERM stopped it: their last cards go within a poll, and the command
                          # must be gone within 3 s of the signal (its own Ray's processes are killed, not waited for)
STOPPED_COLLECT_S = 0.25  # ... and how long it waits for the JobControl to answer (one still starting holds nothing)
LOOK_EVERY_S = 0.25       # how often the driver looks at every actor's progress (one small call each)
STACKS_WAIT_S = 2.0       # how long a stalled job waits for its actors' Python stacks


def run_ray_job(config: PipelineConfig, args: RunArgs, placements: list[Placement], address: str | None,
                machine_gpus: int = 0, allow_busy_gpus: bool = False) -> JobResult:
    """Run the job on Ray.  Raises ConfigError (exit 2) for what the cluster cannot host, before any log exists."""
    labels = tuple(dict.fromkeys(g.node for s in config.steps for g in s.queue_groups if g.node))
    gpu_labels = frozenset(node for node in (config.steps[p.step].queue_groups[p.group].node for p in placements
                                             if p.device.startswith("cuda")) if node)
    config = paths_every_node_sees(config)
    with JobRay(address, labels, gpu_labels, machine_gpus) as cluster:
        nodes = cluster.nodes()
        seats, bundles = seat_runners(config, placements, nodes)
        reservation = reserve_gpus(config, seats, bundles, allow_busy_gpus)
        try:
            config = dataclasses.replace(config, notes=(*config.notes, *busy_notes(list(reservation.gpus))))
            job_dir = open_job_dir(config, args)
            crew = Crew(job_dir.name, config, args, seats, nodes)
            try:
                life = JobLife(job_dir, args, len(config.steps), [seat.placement.name for seat in seats])
                ending = RayJob(args, seats, nodes, cluster, reservation, crew, life).run()
            finally:
                crew.clean_up()
        finally:
            reservation.release()
    return close_job(job_dir, config, args, list(reservation.gpus), ending)


@dataclass
class RayJob:
    """A job whose GPUs are reserved and whose log is open, followed from its actors' launch to its ending."""

    args: RunArgs
    seats: list[Seat]
    nodes: list[NodeInfo]
    cluster: JobRay
    reservation: Reservation
    crew: Crew
    life: JobLife
    state: ControlState = field(default_factory=lambda: ControlState(Termination.RUNNING, 0.0, (), ()))
    offsets: dict[str, ClockOffset] = field(default_factory=dict)
    interrupted: threading.Event = field(default_factory=threading.Event)   # Ctrl-C or SIGTERM came
    outside: Termination = Termination.INTERRUPTED      # which of them, once `interrupted` is set
    start: float | None = None                          # the start barrier's time, once passed
    looked_at: float = 0.0
    late: int = 0                                       # cards counted after the flag's time (JobControl's late)

    @property
    def members(self) -> list[Member]:
        return self.crew.members

    @property
    def control(self) -> Any:
        return self.crew.control

    @property
    def book(self) -> JobBook:
        return self.crew.book

    def run(self) -> JobEnding:
        """Launch the actors, start them together, wait for the flag, stop them; how the job ended.

        A stop (Ctrl-C, SIGTERM: rnb.engines.stopping), also one that came
        while the directory was made, raises the flag at the next poll.
        """
        with STOPS.reacting(lambda stop: self.stopped_from_outside(stop.termination)):
            return self._run()

    def _run(self) -> JobEnding:
        setup_error = None
        try:
            self.crew.launch(self.reservation, self.interrupted)
            self.crew.sample_here(self.life.sampler)
            # Start-up's watch begins once every actor is placed and built: a worker's start is Ray's, not the job's.
            self.life.watch_from_now()
            if self.wait_until(lambda: len(self.book.ready) == len(self.members)):
                self.start = self.start_together()
                self.life.watch.started(self.start)
                if (deadline := self.life.watch.deadline()) is not None:
                    self.control.end_at.remote(deadline)
                self.wait_until(lambda: False)   # until the flag is raised
        except (RuntimeError, ray.exceptions.RayError) as error:  # placement timed out, an actor could not start
            if not self.interrupted.is_set():
                setup_error = f"could not set up the job on Ray ({type(error).__name__}: {_one_line(error)})"
        finally:
            self.stop(self.outside if self.interrupted.is_set() or self.start is not None else Termination.SETUP_FAILED)
            self.life.wind_down()
        reason = self.state.reason
        return self.life.ending(self.book, self.start, self.state.raised_at if reason != Termination.RUNNING else time.time(),
                                reason, setup_error=setup_error, engine=self.engine_record(), counted=self.counted())

    def stopped_from_outside(self, reason: Termination) -> None:
        """A signal handler's whole work: the driver's loop raises the flag at its next look."""
        self.outside = reason
        self.interrupted.set()

    def start_together(self) -> float:
        """Measure each node's clock offset, then open every actor's start gate; the start time."""
        for member in self.members:
            node = self.crew.node_of(member)
            if node not in self.offsets:
                self.offsets[node] = measure_offset(lambda: ray.get(member.actor.clock.remote()))
        start = time.time()
        for member in self.members:
            member.actor.start.remote(self.offsets[self.crew.node_of(member)].offset_s)
        self.life.live.started()
        log.info("started %s on Ray: client and %d runners ready on %d nodes", self.life.job_dir.name, len(self.seats),
                 len(self.offsets))
        return start

    def wait_until(self, done: Callable[[], bool]) -> bool:
        """Poll until done() (True) or the flag is raised (False), showing progress; a failure, Ctrl-C, a stall
        or the maximum duration raises the flag."""
        while True:
            self.poll()
            if self.start is None:
                self.life.live.starting(self.book.ready)
            else:
                self.life.live.running(self.life.spool.rows)
            if self.state.reason != Termination.RUNNING:
                return False
            if done():
                return True
            self.watch_over(time.time())

    def watch_over(self, now: float) -> None:
        """Look at every actor now and then; end the job if it stalled or ran its maximum duration."""
        self.look_around(now)
        if self.start is None:
            found = self.life.watch.start_up(self.book, {m.name: m.seen.cpu_s for m in self.members if m.seen}, now)
        elif self.life.watch.over_time(now):
            self.raise_flag(Termination.MAX_DURATION, self.life.watch.deadline())
            return
        else:
            seen = [(m.name, m.seen) for m in self.members if m.seen and m.seen.progress]
            client = self.members[0].seen   # the client's latest look: whether it waits for a due time
            found = self.life.watch.running({name: look.progress for name, look in seen if look.progress},
                                       lambda: {name: look.demand_s for name, look in seen}, self.book, now,
                                       client=client.client if client else None)
        if found is not None:
            self.stalled(found)

    def look_around(self, now: float, every_s: float = LOOK_EVERY_S) -> None:
        """Ask each running actor that has answered its last look for a new one; take in the answers come since."""
        if now - self.looked_at >= every_s:
            self.looked_at = now
            for member in self.crew.running():
                if member.looking is None:
                    member.looking = member.actor.look.remote()
        asked = {m.looking: m for m in self.members if m.looking is not None}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0) if asked else ([], [])
        for ref in answered:
            member = asked[ref]
            member.looking = None
            try:
                member.seen = ray.get(ref)
            except ray.exceptions.RayError:  # its actor is gone: _ended says so
                continue

    def stalled(self, found: Stall) -> None:
        """Every actor's Python stacks into the log first (what each was doing), then the flag; the stalled one is killed."""
        seen = time.time()   # the job's end: taking the stacks is part of stopping it, not of what it measured
        log.info("the job stalled: asking every actor for its Python stacks")
        asked = {m.actor.stacks.remote(): m for m in self.crew.running()}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=STACKS_WAIT_S) if asked else ([], [])
        for ref in answered:
            try:
                text = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            path = stacks_file(self.life.job_dir, asked[ref].name)
            try:
                path.parent.mkdir(exist_ok=True)
                path.write_text(text)
            except OSError:  # a log directory that cannot take them costs only the stacks
                continue
        self.raise_flag(Termination.STALLED, seen)
        if self.state.reason == Termination.STALLED:
            self.life.stall = found
            self.book.first_failure(found.process, found.sentence)
            for member in self.members:
                if member.name == found.process:
                    self.crew.kill(member)

    def counted(self) -> int | None:
        """Items the final step's runners counted in time, as their latest looks said, less those counted after the
        flag's time (at most -v); None before the start."""
        if self.start is None:
            return None
        last = max(s.placement.step for s in self.seats)
        finals = {s.placement.name for s in self.seats if s.placement.step == last}
        looks = [m.seen.progress for m in self.members if m.name in finals and m.seen is not None]
        if len(looks) < len(finals) or None in looks:
            return None
        return min(self.args.videos, sum(look.left for look in looks if look is not None) - self.late)

    def poll(self, timeout: float = POLL_S) -> None:
        runs = {m.run: m for m in self.crew.running()}
        finished, _ = ray.wait(list(runs), num_returns=len(runs), timeout=timeout) if runs else ([], [])
        if self.interrupted.is_set():  # first: a Ctrl-C to the process group may have ended Ray's workers too
            self.raise_flag(self.outside)
        self.collect()
        for ref in finished:
            self._ended(runs[ref], ref)
        if self.life.spool.writes.first is not None:  # the log directory refused a write
            self.raise_flag(Termination.LOG_FAILED)

    def raise_flag(self, reason: Termination, at: float | None = None) -> None:
        """Have the JobControl raise the flag (the first reason wins), dated `at` or when it does, and halt
        everyone; then look."""
        if self.state.reason == Termination.RUNNING:
            self.control.stop.remote(reason, at)
            self.collect()

    def collect(self) -> None:
        """Take what the JobControl gathered.  If it is gone, the job is over: it failed, now."""
        if self.book.failure is not None and self.book.failure.process == "control":
            return
        try:
            # Stopped from outside, the command waits no longer for a JobControl that is still starting: it has
            # gathered nothing yet, and the job is over.
            state = ray.get(self.control.collect.remote(), timeout=STOPPED_COLLECT_S if self.interrupted.is_set() else None)
        except ray.exceptions.GetTimeoutError:
            state = ControlState(self.outside, time.time(), (), ())
        except ray.exceptions.RayActorError as error:
            self.book.first_failure("control", _death_sentence(error))
            state = ControlState(Termination.PROCESS_FAILED, time.time(), (), ())
            for member in self.members:
                member.actor.halt.remote()
        self.state = state
        self.life.spool.add(state.cards)
        self.late += state.late
        for status in state.statuses:
            self.book.on_status(status)

    def _ended(self, member: Member, ref: Any) -> None:
        """A run() call returned or its actor died: record it; a death while the job runs fails the job."""
        try:
            code = ray.get(ref)
            status = self.book[member.name].status or ("ok" if code == 0 else "failed")
            self.book.update(member.name, exitcode=code, status=status)
            return
        except ray.exceptions.RayActorError as error:
            death = _death_sentence(error)
        except ray.exceptions.RayError as error:  # run() raised before its loop could report (a RayTaskError)
            death = f"{type(error).__name__}: {_one_line(error)}"
        if member.killed_by_driver:
            self.book.update(member.name, status="killed")
            return
        lost = None if member.node is None or _answers(member.node) else (
            f"node {member.node.describe()} was lost: {self.book[member.name].role} {member.name} died with it")
        self.book.update(member.name, status="failed", error=lost or death)
        self.raise_flag(Termination.PROCESS_FAILED)
        if self.state.reason == Termination.PROCESS_FAILED:
            self.book.first_failure(member.name, lost or death, sentence=lost)

    def stop(self, reason: Termination) -> None:
        """Raise the flag (a no-op if raised), give the actors GRACE_S to finish, then kill what is left."""
        self.raise_flag(reason)
        stopped = self.interrupted.is_set()
        deadline = time.time() + (STALLED_GRACE_S if self.life.stall else STOPPED_GRACE_S if stopped else GRACE_S)
        while self.crew.running() and time.time() < deadline:
            self.poll()
        self.last_looks()
        for member in self.crew.running():
            self.crew.kill(member)
        deadline = time.time() + (0.0 if stopped else GRACE_S)   # a stopped command kills its own Ray's processes
        while self.crew.running() and time.time() < deadline:
            self.poll()
        self.collect()
        for member in self.members:
            if self.book[member.name].status is None:
                self.book.update(member.name, status="killed" if member.run is not None else "not started")

    def last_looks(self, timeout_s: float = 1.0) -> None:
        """One more look at every actor still there, before any is killed: what the final step counted in the end."""
        for member in self.members:
            if member.run is not None and not member.killed_by_driver:
                member.looking = member.actor.look.remote()
        deadline = time.time() + timeout_s
        while any(m.looking is not None for m in self.members) and time.time() < deadline:
            self.look_around(time.time(), every_s=float("inf"))
            time.sleep(0.01)

    def engine_record(self) -> dict[str, Any]:
        """meta.json's `engine`: Ray, where, and every node the job used with its clock offset."""
        used = {record.node for record in self.book.records}
        return {"name": "ray", "address": self.cluster.address,
                "cluster": "simulated" if self.cluster.simulated else "own" if self.cluster.own else "given",
                "nodes": {n.node_id: {"ip": n.ip, "labels": dict(n.labels), "cpus": n.cpus, "gpus": n.gpus,
                                      **(dataclasses.asdict(self.offsets[n.node_id]) if n.node_id in self.offsets else {})}
                          for n in self.nodes if n.node_id in used}}



def paths_every_node_sees(config: PipelineConfig) -> PipelineConfig:
    """A relative local dataset root or video glob made absolute here: an actor's working directory is its node's."""
    kind = next(iter(config.source), None)
    if kind is None or kind not in KINDS:
        return config
    where = config.source[kind]
    if not isinstance(where, str) or "://" in where or os.path.isabs(where):
        return config
    return dataclasses.replace(config, source={**config.source, kind: os.path.abspath(where)})


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def _death_sentence(error: Exception) -> str:
    """Ray's multi-paragraph account of an actor's death, cut to its first sentence."""
    first = (str(error).strip().splitlines() or [""])[0].strip()
    return f"its Ray actor died ({type(error).__name__}: {first[:160]})"


def _answers(node: NodeInfo, timeout_s: float = 1.0) -> bool:
    """Whether a node's raylet still takes connections: an actor died alone, or its node went with it."""
    if node.manager_port is None:
        return True
    try:
        with socket.create_connection((node.ip, node.manager_port), timeout=timeout_s):
            return True
    except OSError:
        return False
