"""The job's actors on a Ray cluster: its JobControl, the client and one actor per runner, placed, located and started.

The JobControl exists from the crew's making, so the driver never holds a
job without it; the other actors join as `launch` creates them, so that
whatever it created before a failure is killed with the rest (`clean_up`).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from rnb.core.records import ProcessRecord, Role
from rnb.core.stages import StepEvents
from rnb.core.termination import POLL_S
from rnb.engines.client import ClientSpec
from rnb.engines.job import JobBook, RunArgs
from rnb.engines.ray.actors import ClientActor, RayWiring, RunnerActor
from rnb.engines.ray.cluster import NodeInfo, daemons_here
from rnb.engines.ray.control import JobControl
from rnb.engines.ray.gpu_bundles import Reservation
from rnb.engines.ray.placement import ACTOR_ENV, PLACE_TIMEOUT_S, Seat
from rnb.engines.sampler import Sampler
from rnb.engines.stall import Look
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.plan import Placement


@dataclass
class Member:
    """One actor of the job as the driver follows it; its meta.json record is in the crew's book under `name`."""

    name: str
    actor: Any                               # a Ray actor handle
    run: ray.ObjectRef[Any] | None = None    # its run() call, once started
    node: NodeInfo | None = None             # where Ray placed it, once located (None: a node the job did not list)
    killed_by_driver: bool = False
    looking: ray.ObjectRef[Any] | None = None  # its look() call not yet answered
    seen: Look | None = None                 # what its latest answered look() said


class Crew:
    """The job's JobControl and actors, and the book of their meta.json records."""

    def __init__(self, job: str, config: PipelineConfig, args: RunArgs, seats: Sequence[Seat],
                 nodes: Sequence[NodeInfo]) -> None:
        self.job, self.config, self.args, self.seats, self.nodes = job, config, args, seats, nodes
        self.here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.control: Any = ray.remote(JobControl).options(
            name=f"{job}/control", num_cpus=0, scheduling_strategy=self.here
        ).remote(args.videos, StepEvents(len(config.steps) - 1).handed_over)
        self.members: list[Member] = []
        self.book = JobBook()

    def launch(self, reservation: Reservation, interrupted: threading.Event) -> None:
        """The client on the driver's node, one actor per runner on its seat; then their run() calls.

        The client goes without the runners' ACTOR_ENV: it sends requests,
        never tensors, and touches no GPU, while Ray's zero-copy tensor path
        imports torch in every process it is set for (about 2 s of CPU).
        """
        args = self.args
        self._add("client", "client", None, ray.remote(ClientActor).options(
            name=f"{self.job}/client", num_cpus=0, scheduling_strategy=self.here).remote(self.control,
                                                                                       args.load.concurrency))
        for seat in self.seats:
            step = seat.placement.step
            inbox = args.request_queue_size if step == 0 else args.queue_size  # as the local engine's queues
            self._add(seat.placement.name, "runner", seat.placement, ray.remote(RunnerActor).options(
                name=f"{self.job}/{seat.placement.name}", **self._seat_options(seat, reservation)
            ).remote(self.control, step, inbox))
        self._locate(interrupted)
        client = self.members[0].actor if args.load.concurrency else None
        self.control.attach.remote([m.actor for m in self.members], client)
        by_name = {m.name: m.actor for m in self.members}
        step0 = tuple(by_name[s.placement.name] for s in self.seats if s.placement.step == 0)
        spec = ClientSpec(self.config.source, self.config.path, args.videos, args.load, args.seed)
        self.members[0].run = self.members[0].actor.run.remote(spec, step0, args.request_queue_size)
        for member, seat in zip(self.members[1:], self.seats):
            self._start_runner(member, seat, by_name, reservation)

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

    def running(self) -> list[Member]:
        """The members started and not yet ended."""
        return [m for m in self.members if m.run is not None and self.book[m.name].status is None]

    def node_of(self, member: Member) -> str:
        node = self.book[member.name].node
        assert node is not None, f"{member.name} has no node"  # _locate recorded every member's
        return node

    def kill(self, member: Member) -> None:
        member.killed_by_driver = True
        ray.kill(member.actor, no_restart=True)

    def clean_up(self) -> None:
        """Nothing of the job stays on the cluster: every actor killed, the JobControl too."""
        for actor in [m.actor for m in self.members] + [self.control]:
            ray.kill(actor, no_restart=True)

    def _seat_options(self, seat: Seat, reservation: Reservation) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "runtime_env": {"env_vars": ACTOR_ENV}}
        if seat.bundle is None:
            return {**options, **seat.choice.actor_options()}
        strategy = PlacementGroupSchedulingStrategy(reservation.group, placement_group_bundle_index=seat.bundle)
        return {**options, "num_gpus": seat.gpu_share, "scheduling_strategy": strategy}

    def _add(self, name: str, role: Role, p: Placement | None, actor: Any) -> None:
        if p is None:
            self.book.add(ProcessRecord(name, role, None, None, None, None))
        else:
            self.book.add(ProcessRecord(name, role, p.step, p.group, p.instance, p.device))
        self.members.append(Member(name, actor))

    def _locate(self, interrupted: threading.Event) -> None:
        """Wait for every actor to be placed (or Ctrl-C); record its node, pid and GPUs."""
        where = {m.actor.where.remote(): m for m in self.members}
        deadline = time.time() + PLACE_TIMEOUT_S
        pending = list(where)
        while pending and time.time() < deadline and not interrupted.is_set():
            _, pending = ray.wait(list(where), num_returns=len(where), timeout=POLL_S)
        if pending:
            names = ", ".join(where[ref].name for ref in pending)
            why = "before Ctrl-C" if interrupted.is_set() else f"within {PLACE_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"the Ray cluster did not place {names} {why}")
        nodes = {n.node_id: n for n in self.nodes}
        for ref in where:
            member, found = where[ref], ray.get(ref)
            member.node = nodes.get(found.node_id)
            self.book.update(member.name, pid=found.pid, node=found.node_id, node_ip=member.node and member.node.ip,
                             gpu_ids=found.gpu_ids)

    def _start_runner(self, member: Member, seat: Seat, by_name: Mapping[str, Any], reservation: Reservation) -> None:
        p = seat.placement
        threads = self._threads(member, seat)
        self.book.update(member.name, threads=threads)
        spec = dataclasses.replace(p, device=_own_gpu(p.device), output_device=_own_gpu(p.output_device),
                                   input_device=_own_gpu(p.input_device), threads=threads,
                                   device_uuid=reservation.uuid_of(seat.bundle) if seat.bundle is not None else "")
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


def _own_gpu(device: str) -> str:
    """A placement's device as its actor sees it: Ray shows an actor only its own GPU, as cuda:0."""
    return "cuda:0" if device.startswith("cuda") else "cpu"
