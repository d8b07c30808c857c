"""The Ray engine's driver: one job on a Ray cluster, with the local engine's barriers, timing and log.

    run_ray_job ── connects (rnb.engines.ray.cluster), seats the runners (rnb.engines.ray.placement),
      │            reserves and checks GPUs, creates the actors (rnb.engines.ray.actors)
      ▼
    JobControl ◀── Ready, Failed, Exited, finished cards ── client actor, runner actors
      │
    driver: every actor ready -> clock offsets per node -> start; flag raised -> halt, kill, log

The start time is taken when every actor has reported ready, the end time is
the JobControl's flag (at the target, when the final step counted the last
item it accepted); both on the driver's clock, on which every time card is
stamped too (each actor shifts its stamps by its node's measured offset).  A failed or lost actor ends the job within a poll
interval of Ray noticing; whatever way the job ends, every actor it created
is killed and its placement group removed.  The driver looks at every actor
a few times a second (its progress and its loop's CPU: rnb.engines.stall),
so a job that stalls or runs its maximum duration ends as on the local engine.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from rnb.core.joblog import SAMPLES_FILE
from rnb.core.records import GpuRecord, ProcessRecord, Role
from rnb.core.stages import StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.engines.client import ClientSpec
from rnb.engines.job import JobBook, JobEnding, JobResult, RunArgs, close_job, error_sentence, open_job_dir
from rnb.engines.live import LiveProgress, progress_mode
from rnb.engines.ray.actors import ClientActor, RayWiring, RunnerActor
from rnb.engines.ray.cluster import JobRay, NodeInfo, daemons_here
from rnb.engines.ray.control import ControlState, JobControl
from rnb.engines.ray.placement import NodeChoice, Seat, seat_runners
from rnb.engines.sampler import Sampler
from rnb.engines.spool import TimingsSpool
from rnb.engines.stall import JobWatch, Look, Stall, kept_stacks, stacks_file, stall_error
from rnb.engines.stopping import STOPS
from rnb.pipeline.config import ConfigError, PipelineConfig
from rnb.pipeline.dataset_source import KINDS
from rnb.pipeline.gpus import DEVICE_ORDER, GpuRequestError, busy_notes, check_assigned_gpu
from rnb.pipeline.plan import Placement

log = logging.getLogger(__name__)

# Ray's own zero-copy path for CPU tensors: the consumer reads them straight out of the object store; and
# CUDA numbering GPUs as NVML does, so that the index Ray puts in CUDA_VISIBLE_DEVICES is the GPU it checked.
ACTOR_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", **DEVICE_ORDER}
PLACE_TIMEOUT_S = 120.0   # an actor or GPU bundle not placed by then will not be: the cluster lacks room
GRACE_S = 4.0             # how long halted actors get to finish on their own before they are killed
STALLED_GRACE_S = 1.0     # ... when the job stalled: those not stuck leave within a poll interval
STOPPED_GRACE_S = 1.0     # ... when Ctrl-C or SIGTERM stopped it: their last cards go within a poll, and the command
                          # must be gone within 3 s of the signal (its own Ray's processes are killed, not waited for)
STOPPED_COLLECT_S = 0.25  # ... and how long it waits for the JobControl to answer (one still starting holds nothing)
LOOK_EVERY_S = 0.25       # how often the driver looks at every actor's progress (one small call each)
STACKS_WAIT_S = 2.0       # how long a stalled job waits for its actors' Python stacks
CLOCK_ROUND_TRIPS = 5     # per node; the shortest round trip gives the offset


@dataclass(frozen=True)
class ClockOffset:
    """How far a node's clock runs ahead of the driver's, from the shortest of a few round trips."""

    offset_s: float
    round_trip_s: float


def measure_offset(remote_clock: Callable[[], float], round_trips: int = CLOCK_ROUND_TRIPS,
                   local_clock: Callable[[], float] = time.time) -> ClockOffset:
    """Ask `remote_clock()` (blocking, returns the remote time) a few times; keep the tightest bracket."""
    best: ClockOffset | None = None
    for _ in range(round_trips):
        sent = local_clock()
        remote = remote_clock()
        back = local_clock()
        if best is None or back - sent < best.round_trip_s:
            best = ClockOffset(remote - (sent + back) / 2, back - sent)
    assert best is not None
    return best


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
        job = RayJob(config, args, seats, nodes, cluster)
        try:
            gpus = job.reserve_gpus(bundles, allow_busy_gpus)
            config = dataclasses.replace(config, notes=(*config.notes, *busy_notes(gpus)))
            job_dir = open_job_dir(config, args)
            ending = job.run(job_dir)
        finally:
            job.clean_up()
    return close_job(job_dir, config, args, gpus, ending)


@dataclass
class Member:
    """One actor of the job as the driver follows it; its meta.json record is in the job's book under `name`."""

    name: str
    actor: Any                          # a Ray actor handle
    run: ray.ObjectRef[Any] | None = None   # its run() call
    node: NodeInfo | None = None
    killed_by_driver: bool = False
    looking: ray.ObjectRef[Any] | None = None # its look() call not yet answered
    seen: Look | None = None            # what its latest answered look() said


@dataclass
class RayJob:
    config: PipelineConfig
    args: RunArgs
    seats: list[Seat]
    nodes: list[NodeInfo]
    cluster: JobRay
    group: Any = None                                   # the placement group of the GPU bundles
    gpu_uuids: list[str] = field(default_factory=list)  # NVML's UUID of each bundle's GPU, as its check found it
    control: Any = None
    members: list[Member] = field(default_factory=list)
    spool: TimingsSpool | None = None                   # finished items, streamed to disk as they come
    book: JobBook = field(default_factory=JobBook)
    state: ControlState | None = None
    offsets: dict[str, ClockOffset] = field(default_factory=dict)
    interrupted: threading.Event = field(default_factory=threading.Event)   # Ctrl-C or SIGTERM came
    outside: Termination = Termination.INTERRUPTED      # which of them, once `interrupted` is set
    job_dir: Path | None = None
    watch: JobWatch | None = None                       # stalls and the maximum duration, from start-up on
    start: float | None = None
    stall: Stall | None = None                          # the stall that ended the job, if one did
    looked_at: float = 0.0
    late: int = 0                                       # cards counted after the flag's time (JobControl's late)
    live: LiveProgress = field(default_factory=lambda: LiveProgress((), 0, "off"))  # what stderr shows; run() sets it

    def reserve_gpus(self, bundles: Sequence[NodeChoice], allow_busy: bool) -> list[GpuRecord]:
        """The placement group of the GPU bundles, each GPU checked free by NVML on its node (GpuRequestError)."""
        if not bundles:
            return []
        shapes = [choice.bundle() for choice in bundles]
        self.group = placement_group([s for s, _ in shapes], strategy="PACK",
                                     bundle_label_selector=[label for _, label in shapes])
        ready, _ = ray.wait([self.group.ready()], timeout=PLACE_TIMEOUT_S)
        if not ready:
            first = next(seat for seat in self.seats if seat.bundle is not None)
            raise ConfigError(self.config.path, first.gpus_path, f"expected the Ray cluster to give the job "
                              f"{len(bundles)} GPUs, found them not free within {PLACE_TIMEOUT_S:.0f} s")
        firsts = [next(seat for seat in self.seats if seat.bundle == index) for index in range(len(bundles))]
        checks = [ray.remote(_check_gpu_here).options(num_cpus=0, num_gpus=1, runtime_env={"env_vars": ACTOR_ENV},
                                                      scheduling_strategy=PlacementGroupSchedulingStrategy(
                                                          self.group, placement_group_bundle_index=index))
            .remote(self.config.path, seat.gpus_path, allow_busy) for index, seat in enumerate(firsts)]
        infos = []
        for seat, found in zip(firsts, ray.get(checks)):
            if isinstance(found, str):
                raise ConfigError(self.config.path, seat.gpus_path, found)
            infos.append(found)
        self.gpu_uuids = [info.uuid for info in infos]
        return infos

    def run(self, job_dir: Path) -> JobEnding:
        """Create the actors, start them together, wait for the flag, stop them; how the job ended.

        A stop (Ctrl-C, SIGTERM: rnb.engines.stopping), also one that came
        while the directory was made, raises the flag at the next poll.
        """
        with STOPS.reacting(lambda stop: self.stopped_from_outside(stop.termination)):
            return self._run(job_dir)

    def _run(self, job_dir: Path) -> JobEnding:
        setup_error = None
        job = job_dir.name
        self.job_dir = job_dir
        self.spool = TimingsSpool(job_dir, len(self.config.steps), self.args.warmup)
        sampler = Sampler(self.args.sample_interval_ms / 1000.0)
        self.live = LiveProgress(["client", *(seat.placement.name for seat in self.seats)], self.args.videos,
                                 progress_mode(self.args.quiet, sys.stderr))
        try:
            self.launch(job)
            self.sample_here(sampler)
            # Start-up's watch begins once every actor is placed and built: a worker's start is Ray's, not the job's.
            self.watch = JobWatch(self.args.stall_s, self.args.max_duration_s, time.time())
            if self.wait_until(lambda: len(self.book.ready) == len(self.members)):
                self.start = self.start_together(job)
                self.watch.started(self.start)
                if (deadline := self.watch.deadline()) is not None:
                    self.control.end_at.remote(deadline)
                self.follow()
        except (RuntimeError, ray.exceptions.RayError) as error:  # placement timed out, an actor could not start
            if not self.interrupted.is_set():
                setup_error = f"could not set up the job on Ray ({type(error).__name__}: {_one_line(error)})"
        finally:
            self.stop(self.outside if self.interrupted.is_set() or self.start is not None else Termination.SETUP_FAILED)
            self.live.close(self.spool.rows)
            sampler.stop()
            self.spool.writes.attempt(job_dir / SAMPLES_FILE, lambda: sampler.write(job_dir))
        assert self.state is not None  # stop() leaves the flag's state, whatever came before
        reason = self.state.reason
        stacks = kept_stacks(job_dir)
        for name, path in stacks.items():
            self.book.update(name, stacks=path)
        stalled = stall_error(self.stall, job_dir, stacks) if self.stall else None
        return JobEnding(start=self.start, end=self.state.raised_at if reason != Termination.RUNNING else time.time(),
                         reason=reason, error=setup_error or error_sentence(reason, self.book.failure, self.args, stalled),
                         spool=self.spool, book=self.book, engine=self.engine_record(), counted=self.counted())

    def stopped_from_outside(self, reason: Termination) -> None:
        """A signal handler's whole work: the driver's loop raises the flag at its next look."""
        self.outside = reason
        self.interrupted.set()

    def launch(self, job: str) -> None:
        """The JobControl and client on the driver's node, one actor per runner on its seat; then their run() calls."""
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.control = ray.remote(JobControl).options(
            name=f"{job}/control", num_cpus=0, scheduling_strategy=here
        ).remote(self.args.videos, StepEvents(len(self.config.steps) - 1).handed_over)
        self._add("client", "client", None, ray.remote(ClientActor).options(
            name=f"{job}/client", num_cpus=0, scheduling_strategy=here, runtime_env={"env_vars": ACTOR_ENV}
        ).remote(self.control, self.args.load.concurrency))
        for seat in self.seats:
            step = seat.placement.step
            inbox = self.args.request_queue_size if step == 0 else self.args.queue_size  # as the local engine's queues
            self._add(seat.placement.name, "runner", seat.placement, ray.remote(RunnerActor).options(
                name=f"{job}/{seat.placement.name}", **self._seat_options(seat)).remote(self.control, step, inbox))
        self._locate()
        client = self.members[0].actor if self.args.load.concurrency else None
        self.control.attach.remote([m.actor for m in self.members], client)
        by_name = {m.name: m.actor for m in self.members}
        step0 = tuple(by_name[s.placement.name] for s in self.seats if s.placement.step == 0)
        spec = ClientSpec(self.config.source, self.config.path, self.args.videos, self.args.load, self.args.seed)
        self.members[0].run = self.members[0].actor.run.remote(spec, step0, self.args.request_queue_size)
        for member, seat in zip(self.members[1:], self.seats):
            self._start_runner(member, seat, by_name)

    def sample_here(self, sampler: Sampler) -> None:
        """Sample the driver, the actors on its machine and the cluster's processes there (raylets, the GCS):
        the other machines' processes are out of its reach."""
        sampler.watch("main", os.getpid())
        here = ray.util.get_node_ip_address()
        ours = {os.getpid()}
        for member in self.members:
            record = self.book[member.name]
            if record.node_ip == here and record.pid is not None:
                ours.add(record.pid)
                sampler.watch(member.name, record.pid)
        for name, pid in daemons_here(ray.get_runtime_context().get_session_name(), ours):
            sampler.watch(name, pid)
        sampler.start()

    def _seat_options(self, seat: Seat) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "runtime_env": {"env_vars": ACTOR_ENV}}
        if seat.bundle is None:
            return {**options, **seat.choice.actor_options()}
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=seat.bundle)
        return {**options, "num_gpus": seat.gpu_share, "scheduling_strategy": strategy}

    def _add(self, name: str, role: Role, p: Placement | None, actor: Any) -> None:
        if p is None:
            self.book.add(ProcessRecord(name, role, None, None, None, None))
        else:
            self.book.add(ProcessRecord(name, role, p.step, p.group, p.instance, p.device))
        self.members.append(Member(name, actor))

    def _locate(self) -> None:
        """Wait for every actor to be placed (or Ctrl-C); record its node, pid and GPUs."""
        where = {m.actor.where.remote(): m for m in self.members}
        deadline = time.time() + PLACE_TIMEOUT_S
        pending = list(where)
        while pending and time.time() < deadline and not self.interrupted.is_set():
            _, pending = ray.wait(list(where), num_returns=len(where), timeout=POLL_S)
        if pending:
            names = ", ".join(where[ref].name for ref in pending)
            why = "before Ctrl-C" if self.interrupted.is_set() else f"within {PLACE_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"the Ray cluster did not place {names} {why}")
        nodes = {n.node_id: n for n in self.nodes}
        for ref in where:
            member, found = where[ref], ray.get(ref)
            member.node = nodes.get(found.node_id)
            self.book.update(member.name, pid=found.pid, node=found.node_id, node_ip=member.node and member.node.ip,
                             gpu_ids=found.gpu_ids)

    def _start_runner(self, member: Member, seat: Seat, by_name: Mapping[str, Any]) -> None:
        p = seat.placement
        threads = self._threads(member, seat)
        self.book.update(member.name, threads=threads)
        spec = dataclasses.replace(p, device=_own_gpu(p.device), output_device=_own_gpu(p.output_device),
                                   input_device=_own_gpu(p.input_device), threads=threads,
                                   device_uuid=self.gpu_uuids[seat.bundle] if seat.bundle is not None else "")
        consumers = tuple(tuple(by_name[s.placement.name] for s in self.seats
                                if s.placement.step == p.step + 1 and s.placement.in_queue == q) for q in p.out_queues)
        wiring = RayWiring(self.control, consumers, max(1, p.num_slots), count_at_once=bool(self.args.load.concurrency))
        member.run = member.actor.run.remote(spec, wiring)

    def _threads(self, member: Member, seat: Seat) -> int | None:
        """A CPU runner's share of its node's cores (like rnb.pipeline.plan, per node); its "threads" keyword wins."""
        p = seat.placement
        explicit = self.config.steps[p.step].queue_groups[p.group].model_kwargs.get("threads")
        if explicit is not None or seat.bundle is not None or member.node is None:
            return explicit
        neighbours = sum(1 for m, s in zip(self.members[1:], self.seats) if m.node is member.node and s.bundle is None)
        return max(1, member.node.cpus // max(1, neighbours))

    def start_together(self, job: str) -> float:
        """Measure each node's clock offset, then open every actor's start gate; the start time."""
        for member in self.members:
            node = self._node_id(member)
            if node not in self.offsets:
                self.offsets[node] = measure_offset(lambda: ray.get(member.actor.clock.remote()))
        start = time.time()
        for member in self.members:
            member.actor.start.remote(self.offsets[self._node_id(member)].offset_s)
        self.live.started()
        log.info("started %s on Ray: client and %d runners ready on %d nodes", job, len(self.seats), len(self.offsets))
        return start

    def _node_id(self, member: Member) -> str:
        node = self.book[member.name].node
        assert node is not None, f"{member.name} has no node"  # _locate recorded every member's
        return node

    def follow(self) -> None:
        """Until the flag is raised: take in statuses and cards, notice failures, show progress."""
        self.wait_until(lambda: False)

    def wait_until(self, done: Callable[[], bool]) -> bool:
        """Poll until done() (True) or the flag is raised (False), showing progress; a failure, Ctrl-C, a stall
        or the maximum duration raises the flag."""
        while True:
            self.poll()
            assert self.spool is not None and self.state is not None  # run() made the spool, poll() the state
            if self.start is None:
                self.live.starting(self.book.ready)
            else:
                self.live.running(self.spool.rows)
            if self.state.reason != Termination.RUNNING:
                return False
            if done():
                return True
            self.watch_over(time.time())

    def watch_over(self, now: float) -> None:
        """Look at every actor now and then; end the job if it stalled or ran its maximum duration."""
        assert self.watch is not None
        self.look_around(now)
        if self.start is None:
            found = self.watch.start_up(self.book, {m.name: m.seen.cpu_s for m in self.members if m.seen}, now)
        elif self.watch.over_time(now):
            self.raise_flag(Termination.MAX_DURATION, self.watch.deadline())
            return
        else:
            seen = [(m.name, m.seen) for m in self.members if m.seen and m.seen.progress]
            client = self.members[0].seen   # the client's latest look: whether it waits for a due time
            found = self.watch.running({name: look.progress for name, look in seen if look.progress},
                                       lambda: {name: look.demand_s for name, look in seen}, self.book, now,
                                       client=client.client if client else None)
        if found is not None:
            self.stalled(found)

    def look_around(self, now: float, every_s: float = LOOK_EVERY_S) -> None:
        """Ask each running actor that has answered its last look for a new one; take in the answers come since."""
        if now - self.looked_at >= every_s:
            self.looked_at = now
            for member in self._running():
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
        assert self.job_dir is not None
        seen = time.time()   # the job's end: taking the stacks is part of stopping it, not of what it measured
        log.info("the job stalled: asking every actor for its Python stacks")
        asked = {m.actor.stacks.remote(): m for m in self._running()}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=STACKS_WAIT_S) if asked else ([], [])
        for ref in answered:
            try:
                text = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            path = stacks_file(self.job_dir, asked[ref].name)
            try:
                path.parent.mkdir(exist_ok=True)
                path.write_text(text)
            except OSError:  # a log directory that cannot take them costs only the stacks
                continue
        self.raise_flag(Termination.STALLED, seen)
        if self.state is not None and self.state.reason == Termination.STALLED:
            self.stall = found
            self.book.first_failure(found.process, found.sentence)
            for member in self.members:
                if member.name == found.process:
                    member.killed_by_driver = True
                    ray.kill(member.actor, no_restart=True)

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
        runs = {m.run: m for m in self._running()}
        finished, _ = ray.wait(list(runs), num_returns=len(runs), timeout=timeout) if runs else ([], [])
        if self.interrupted.is_set():  # first: a Ctrl-C to the process group may have ended Ray's workers too
            self.raise_flag(self.outside)
        self.collect()
        for ref in finished:
            self._ended(runs[ref], ref)
        if self.spool is not None and self.spool.writes.first is not None:  # the log directory refused a write
            self.raise_flag(Termination.LOG_FAILED)

    def raise_flag(self, reason: Termination, at: float | None = None) -> None:
        """Have the JobControl raise the flag (the first reason wins), dated `at` or when it does, and halt
        everyone; then look."""
        if self.state is None or self.state.reason == Termination.RUNNING:
            self.control.stop.remote(reason, at)
            self.collect()

    def collect(self) -> None:
        """Take what the JobControl gathered.  If it is gone, the job is over: it failed, now."""
        if self.state is not None and self.book.failure is not None and self.book.failure.process == "control":
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
        assert self.spool is not None  # a job collects only once it runs
        self.spool.add(state.cards)
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
        if self.state is not None and self.state.reason == Termination.PROCESS_FAILED:
            self.book.first_failure(member.name, lost or death, sentence=lost)

    def stop(self, reason: Termination) -> None:
        """Raise the flag (a no-op if raised), give the actors GRACE_S to finish, then kill what is left."""
        if self.control is None:
            self.state = ControlState(reason, time.time(), (), ())
            return
        self.raise_flag(reason)
        stopped = self.interrupted.is_set()
        deadline = time.time() + (STALLED_GRACE_S if self.stall else STOPPED_GRACE_S if stopped else GRACE_S)
        while self._running() and time.time() < deadline:
            self.poll()
        self.last_looks()
        for member in self._running():
            member.killed_by_driver = True
            ray.kill(member.actor, no_restart=True)
        deadline = time.time() + (0.0 if stopped else GRACE_S)   # a stopped command kills its own Ray's processes
        while self._running() and time.time() < deadline:
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

    def _running(self) -> list[Member]:
        return [m for m in self.members if m.run is not None and self.book[m.name].status is None]

    def clean_up(self) -> None:
        """Nothing of the job stays on the cluster: every actor killed, the placement group removed."""
        for actor in [m.actor for m in self.members] + ([self.control] if self.control is not None else []):
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)

    def engine_record(self) -> dict[str, Any]:
        """meta.json's `engine`: Ray, where, and every node the job used with its clock offset."""
        used = {record.node for record in self.book.records}
        return {"name": "ray", "address": self.cluster.address,
                "cluster": "simulated" if self.cluster.simulated else "own" if self.cluster.own else "given",
                "nodes": {n.node_id: {"ip": n.ip, "labels": dict(n.labels), "cpus": n.cpus, "gpus": n.gpus,
                                      **(dataclasses.asdict(self.offsets[n.node_id]) if n.node_id in self.offsets else {})}
                          for n in self.nodes if n.node_id in used}}


def _own_gpu(device: str) -> str:
    """A placement's device as its actor sees it: Ray shows an actor only its own GPU, as cuda:0."""
    return "cuda:0" if device.startswith("cuda") else "cpu"


def paths_every_node_sees(config: PipelineConfig) -> PipelineConfig:
    """A relative local dataset root or video glob made absolute here: an actor's working directory is its node's."""
    kind = next(iter(config.source), None)
    if kind is None or kind not in KINDS:
        return config
    where = config.source[kind]
    if not isinstance(where, str) or "://" in where or os.path.isabs(where):
        return config
    return dataclasses.replace(config, source={**config.source, kind: os.path.abspath(where)})


def _check_gpu_here(file: str, json_path: str, allow_busy: bool) -> GpuRecord | str:
    """A Ray task on a GPU bundle's node: the GPU Ray gave it, checked; or what is wrong with it.

    What is wrong comes back as a value: Ray cannot carry a ConfigError back raised.
    """
    try:
        return check_assigned_gpu(file, json_path, allow_busy=allow_busy)
    except GpuRequestError as error:
        return f"{error.expected} (on the Ray node at {ray.util.get_node_ip_address()})"


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
