"""Estimate: a discrete-event simulation of a whole candidate pipeline, fed by the profiles.

It follows what the harness does, event by event: the client's arrivals
(Poisson, bulk, or a closed loop), one FIFO queue per (step, out queue) from
which every replica of the groups reading it takes the oldest item when it
is free, each replica's calls (their occupancy sampled from the group's
profile at the candidate's form), the Batcher's policy (hand over at `batch`
items, or a partial batch once the input has been idle for a poll interval
and the first item has waited `timeout_ms`), segments (each split off and
selected on its own, merged where a step merges them), round-robin output
queue selection per replica, and back-pressure: a replica hands an output
on only into one of its own `num_shared_tensors` slots, and a slot is free
again once a consumer has taken the item off the queue.  Replicas that
share a GPU run their model calls one at a time on it (kernels of separate
processes are time-sliced, not overlapped).  The host's cores are shared by
processor sharing (rnb.tune.cores.SharedCores) among the calls computing on
them and the client's and main's work per item: a call's CPU seconds (its
profile's CPU fraction of its occupancy) stretch when more work computes
than the host has cores.  On Ray each pool of cores (one host, or the hosts
one node label spans: rnb.tune.hosts) is shared so on its own, with the CPU
that Ray's daemons spend per item and hop as background on the pool of the
hop's receiving end, and each actor call's CPU at both of its ends.  A hop
also takes time: an item reaches the next queue one hop's latency after its
hand-over (as profiled: the profiling job's hop into its sink, tenths of a
millisecond on the local engine, milliseconds on Ray), and on Ray the
producer's slot is free again only once the take has come back as the
call's reply, another hop later.

Why a small event loop of our own and not simpy: the model needs five kinds
of event and no process abstraction, and each candidate's peak rate takes a
dozen simulations of a few thousand items inside a search over many
candidates.  A heap of plain callbacks runs about 1 us per event, several
times faster than simpy's generator processes, and adds no dependency.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rnb.analysis.sweep import Trial, bisect_rate
from rnb.core.termination import POLL_S  # the runner's receive timeout: an idle Batcher may flush after it
from rnb.engines.registry import spans_hosts
from rnb.load import LoadSettings, mode_of
from rnb.pipeline.config import merges_segments
from rnb.pipeline.plan import thread_share
from rnb.tune.cores import SharedCores
from rnb.tune.profile import Bench, Form, Profile, ProfileKey, forms_of, profile_key, unit_plan
from rnb.tune.space import Candidate, TuneSpace

DEFAULT_ITEMS = 3000   # items per simulation: enough to read a p99 off
LATENCY_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)


class EstimateError(RuntimeError):
    """A candidate the estimator cannot simulate (a profile it needs is missing); one sentence."""


@dataclass(frozen=True)
class Arrivals:
    """The load: Poisson at `rate_per_s`, bulk (every request at once), a closed loop of `concurrency`, or
    `times` (seconds from the start, one per item): a measured job's own arrivals, replayed."""

    kind: Literal["poisson", "bulk", "closed", "trace"]
    rate_per_s: float = 0.0
    concurrency: int = 0
    times: tuple[float, ...] = ()

    @staticmethod
    def poisson(rate_per_s: float) -> Arrivals:
        return Arrivals("poisson", rate_per_s=rate_per_s)

    @staticmethod
    def of_load(settings: LoadSettings, seed: int, items: int) -> Arrivals:
        """A benchmark load (rnb.load) as the simulation offers it: Poisson arrivals, camera streams, traces and
        schedules as the due times of their first `items` requests (under the queue policy: the simulation drops
        nothing), drawn from `seed` as a job's client draws them.

        A job's Poisson arrivals are one draw of its seed, not the process:
        the p99 of a few hundred items moves by a third from one draw to
        another, so a prediction to hold against a job offers the job's own.
        """
        mode = mode_of(settings)
        if mode.name == "closed_loop":
            return Arrivals("closed", concurrency=settings.concurrency or 1)
        if mode.saturating:
            return Arrivals("bulk")
        due = (arrival.due_s for arrival in itertools.islice(mode.arrivals(settings, seed), items))
        return Arrivals("trace", times=tuple(0.0 if when is None else when for when in due))


@dataclass(frozen=True)
class Service:
    """What one call occupies a runner of a group, sampled with replacement from its profile (seconds)."""

    emit: tuple[float, ...]
    held: tuple[float, ...] = ()
    inside: tuple[float, ...] = ()   # the device's share of each emitting call, index for index
    partial: tuple[float, ...] = ()  # factor of a call of m cards (m = 1.., index m - 1) against a full one

    @staticmethod
    def constant(emit_s: float, held_s: float = 0.0, inside_s: float | None = None) -> Service:
        """A deterministic service time: what hand-worked queueing cases and tests need."""
        return Service((emit_s,), (held_s,) if held_s else (), (emit_s if inside_s is None else inside_s,))

    @property
    def mean_emit(self) -> float:
        return float(np.mean(self.emit))

    @property
    def mean_held(self) -> float:
        return float(np.mean(self.held)) if self.held else 0.0


@dataclass(frozen=True)
class SimGroup:
    """One queue group as the simulation sees it."""

    name: str
    step: int
    devices: tuple[int, ...]          # a replica per entry; >= 0 shares that GPU with the others on it
    in_queue: int | None              # None: the request queue
    out_queues: tuple[int, ...]       # () on the final step
    slots: int                        # output slots per replica (0 on the final step)
    service: Service
    splits: int = 1                   # num_segments of its step
    batch: int | None = None          # a Batcher group's batch
    timeout_s: float = 0.05           # a Batcher's timeout_ms
    merges: bool = False              # it merges an item's segments before handing on
    cpu_fraction: float = 0.0         # CPU seconds per second of a call's profiled occupancy (CpuUse.fraction)
    profiled_threads: int = 1         # the threads its profile's CPU seconds ran on
    threads: int = 1                  # the threads each replica computes on in the candidate
    pool: int = 0                     # the cores it computes on: 0 the driver's host's, k other_pools[k - 1]

    def cpu_per_item_s(self, items_per_call: int) -> float:
        """CPU seconds the group spends per item at full batches (whichever replica serves it)."""
        per_call = (self.service.mean_emit + (self.batch - 1) * self.service.mean_held if self.batch
                    else self.service.mean_emit)
        return self.cpu_fraction * per_call / max(1, items_per_call)


@dataclass(frozen=True)
class Background:
    """CPU seconds per item of the processes outside the steps: the client (per request) and main (per result),
    and per item and hop (`hop_s`) Ray's daemons (raylet, GCS), on the pool of the hop's receiving end; on Ray
    also `call_s`, what an actor call of its own costs each end: the process making it and the one it reaches."""

    client_s: float = 0.0
    main_s: float = 0.0
    hop_s: float = 0.0
    call_s: float = 0.0


@dataclass(frozen=True)
class SimPipeline:
    groups: tuple[SimGroup, ...]
    num_steps: int
    cores: float = 0.0                # the host's usable cores; 0: not modelled (every call keeps its profiled time)
    background: Background = Background()
    other_pools: tuple[float, ...] = ()   # usable cores of pools 1, 2, ...: other hosts of a Ray cluster
    delivery_s: float = 0.0           # from a hand-over until the next step can take the item: one hop's latency
    release_s: float = 0.0            # from a take until the producer's slot is free again (Ray: the call's reply)

    def capacity_per_s(self) -> float:
        """Items per second no load can exceed: the least of each step's summed replica capacity and the cores'.

        An upper end for the search of the peak rate; back-pressure, device
        sharing, CPU sharing and routing only lower it.
        """
        by_step: dict[int, float] = {}
        for g in self.groups:
            cards = g.batch or 1
            per_call = g.service.mean_emit + (cards - 1) * g.service.mean_held if g.batch else g.service.mean_emit
            per_call = max(per_call, 1e-9)
            items_per_call = cards if g.batch else _cards_in(self, g)
            by_step[g.step] = by_step.get(g.step, 0.0) + len(g.devices) * items_per_call / per_call
        return min(*by_step.values(), self.cores_capacity_per_s())

    def cores_capacity_per_s(self) -> float:
        """Items per second the cores can compute: the least over the pools (infinite where they are not modelled)."""
        if not self.cores:
            return math.inf
        return min((cores / cpu for cores, cpu in zip(self.pool_cores, self.cpu_by_pool()) if cpu > 0), default=math.inf)

    @property
    def pool_cores(self) -> tuple[float, ...]:
        return (self.cores, *self.other_pools)

    def cpu_by_pool(self) -> list[float]:
        """CPU seconds each pool of cores spends per item: its groups', its hops' and (pool 0) the client's and main's.

        An item enters each step once, through one of its groups: a group
        of a step with several takes its share of the step's hops.
        """
        spent = [0.0] * len(self.pool_cores)
        groups_in = {step: sum(1 for g in self.groups if g.step == step) for step in range(self.num_steps)}
        for g in self.groups:
            share = 1.0 / groups_in[g.step]
            calls = self.background.call_s * share / _cards_in(self, g)   # at most a call per message into g
            spent[g.pool] += g.cpu_per_item_s(g.batch or _cards_in(self, g)) + self.background.hop_s * share + calls
            senders = [other.pool for other in self.groups if other.step == g.step - 1] or [0]   # step 0: the client
            for pool in senders:
                spent[pool] += calls / len(senders)
        spent[0] += self.background.client_s + self.background.main_s + self.background.hop_s   # the hop to main
        return spent

    def bound_by_cores(self) -> bool:
        """Whether the host's cores, not any step's replicas, set the capacity: more CPU replicas add nothing."""
        return self.cores_capacity_per_s() <= self.capacity_per_s() * (1 + 1e-9)

    def cpu_by_group(self) -> dict[str, float]:
        """CPU seconds each group spends per item, at full batches."""
        return {g.name: g.cpu_per_item_s(g.batch or _cards_in(self, g)) for g in self.groups}

    def cpu_per_item_s(self) -> float:
        """CPU seconds every pool together spends per item: every group's, the hops', the client's and main's."""
        return sum(self.cpu_by_pool())


def _cards_in(pipeline: SimPipeline, g: SimGroup) -> int:
    """Items per call a group gets at full batches: the product of the batches before it."""
    cards = 1
    for other in pipeline.groups:
        if other.step < g.step and other.batch:
            cards *= other.batch
    return cards


@dataclass(frozen=True)
class Prediction:
    """What the simulation measured, the way the jobs table measures a run."""

    arrivals: Arrivals
    throughput_items_per_s: float       # measured items / (last finish - first enqueue)
    latency_ms: Mapping[float, float]   # end-to-end percentile -> ms, over the items after warm-up
    mean_latency_ms: float
    busy: Mapping[str, float]           # group name -> mean busy fraction of its replicas
    items: int
    cores_busy: float | None = None     # the busiest pool's cores' busy fraction over the run; None where not modelled

    def percentile_ms(self, q: float) -> float:
        return self.latency_ms[q]

    @property
    def bottleneck(self) -> str:
        """The group whose replicas were busiest (the first on a tie)."""
        return max(self.busy, key=lambda name: self.busy[name])


@dataclass(frozen=True)
class PeakEstimate:
    """The predicted peak Poisson rate whose percentile stays under the bound, and the run at it."""

    rate_per_s: float | None            # None: not even the lowest rate tried meets the bound
    at_peak: Prediction | None          # the simulation at that rate
    lowest: Prediction                  # the lowest rate tried (the closest the candidate gets, if it fails)
    capacity_per_s: float


def pipeline_of(space: TuneSpace, candidate: Candidate, profiles: Mapping[ProfileKey, Profile],
                bench: Bench) -> SimPipeline:
    """The candidate as the simulation sees it: every group with its replicas and its profiled service.

    Each CPU replica computes on the thread share the harness would give it
    in this candidate (rnb.pipeline.plan.thread_share over its CPU runners;
    on Ray its node's CPU resource over the CPU runners on the node), not
    the one of its profiling job; a "threads" keyword wins, as there.  On
    Ray each group computes on its node label's pool of cores (bench.hosts).
    """
    plan = unit_plan(space)
    forms = forms_of(space, candidate)
    by_group: dict[tuple[str, str, str], list[Profile]] = {}   # the same group at other forms
    for profile in profiles.values():
        by_group.setdefault((profile.key.model, profile.key.keywords, profile.key.input_shapes), []).append(profile)
    shares = _thread_shares(space, candidate, bench)
    groups = []
    used = []
    for g in space.groups:
        step = space.config.steps[g.step]
        group = step.queue_groups[g.group]
        form = forms[(g.step, g.group)]
        key = profile_key(space, plan, g, form, bench)
        if key not in profiles:
            raise EstimateError(f"no profile of {g.name} ({g.model}) at {_describe(form)}; profile it first.")
        profile = profiles[key]
        used.append(profile)
        settings = candidate.group(g.step, g.group)
        siblings = [p for p in by_group[(key.model, key.keywords, key.input_shapes)]
                    if (p.key.form.segments, p.key.form.splits, p.key.form.batch) == (form.segments, form.splits, form.batch)]
        share = shares[_node_of(bench, group.node)]
        threads = int(group.model_kwargs.get("threads", share if settings.devices[0] < 0 else bench.cores.affinity))
        groups.append(SimGroup(
            name=g.name, step=g.step, devices=settings.devices, in_queue=group.in_queue, out_queues=group.out_queues,
            slots=step.num_shared_tensors, service=service_of(profile, form.cards, siblings),
            splits=candidate.steps[g.step].segments, batch=settings.batch,
            timeout_s=float(group.model_kwargs.get("timeout_ms", 50.0)) / 1000.0 if settings.batch else POLL_S,
            merges=merges_segments(g.model), cpu_fraction=profile.cpu.fraction,
            profiled_threads=max(1, profile.cpu.threads), threads=max(1, threads),
            pool=bench.hosts.pool_of(group.node) if spans_hosts(bench.engine) else 0))
    background = Background(float(np.median([p.cpu.client_per_item_s for p in used])),
                            float(np.median([p.cpu.main_per_item_s for p in used])),
                            float(np.median([p.cpu.daemons_per_hop_s for p in used])),
                            float(np.median([p.cpu.hop_per_item_s for p in used])) if spans_hosts(bench.engine) else 0.0)
    pools = (bench.hosts.cores if spans_hosts(bench.engine) else ()) or (bench.cores.usable,)
    hops = [p.hop_latency_s for p in used if p.hop_latency_s > 0]
    delivery = float(np.median(hops)) if hops else 0.0
    return SimPipeline(tuple(groups), space.num_steps, pools[0], background, pools[1:], delivery,
                       delivery if spans_hosts(bench.engine) else 0.0)


def _node_of(bench: Bench, node: str | None) -> str | None:
    """A group's node label where the engine shares threads per node (Ray, a label whose CPUs are known)."""
    return node if spans_hosts(bench.engine) and bench.hosts.cpus_of(node) is not None else None


def _thread_shares(space: TuneSpace, candidate: Candidate, bench: Bench) -> dict[str | None, int]:
    """A CPU runner's thread share per node label (None: the host's), as the engine gives it."""
    runners: dict[str | None, int] = {}
    for g in space.groups:
        node = _node_of(bench, space.config.steps[g.step].queue_groups[g.group].node)
        runners[node] = runners.get(node, 0) + sum(1 for device in candidate.group(g.step, g.group).devices
                                                   if device < 0)
    return {node: thread_share(bench.hosts.cpus_of(node) or bench.cores.affinity, count)
            for node, count in runners.items()}


def _describe(form: Form) -> str:
    parts = [f"{form.cards} items per call"]
    if form.batch > 1:
        parts.append(f"batch {form.batch}")
    if form.segments > 1:
        parts.append(f"{form.segments} segments per item")
    if form.splits > 1:
        parts.append(f"split in {form.splits}")
    return ", ".join(parts)


def service_of(profile: Profile, cards: int, siblings: Sequence[Profile]) -> Service:
    """A profile as samples, with the factor a partial batch of m < cards items costs against a full one.

    The factor interpolates the mean call time linearly between the
    profiled sizes (a line through the two smallest below them).
    """
    sizes = sorted({p.key.form.cards: p.mean_emit_s for p in siblings}.items())
    xs = np.array([size for size, _ in sizes], dtype=float)
    ys = np.array([mean for _, mean in sizes], dtype=float)
    full = profile.mean_emit_s
    partial = []
    for m in range(1, cards + 1):
        if len(xs) >= 2 and m < xs[0]:
            slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            mean = ys[0] + slope * (m - xs[0])
        elif len(xs):
            mean = float(np.interp(m, xs, ys))
        else:
            mean = full
        partial.append(max(mean, 0.05 * full) / full if full > 0 else 1.0)
    return Service(profile.emit_s, profile.held_s, profile.inside_s or profile.emit_s, tuple(partial))


# ---------------------------------------------------------------- the simulation

IDLE, CALLING, BLOCKED = 0, 1, 2   # a replica waits for input, is inside a call, or waits for a free slot


class _Replica:
    __slots__ = ("group", "device", "queue", "outs", "free", "outbox", "rr", "pending", "first", "token",
                 "busy_s", "state", "merging", "computing", "sends")

    def __init__(self, group: SimGroup, device: int, queue: _Queue, outs: list[_Queue]) -> None:
        self.group = group
        self.device = device
        self.queue = queue
        self.outs = outs
        self.free = group.slots
        self.outbox: deque[_Job] = deque()
        self.rr = 0                        # the round-robin selector's turn
        self.pending: list[_Job] = []      # a Batcher's items so far
        self.first = 0.0                   # when its first pending item arrived
        self.token = 0                     # invalidates a stale idle timer
        self.busy_s = 0.0
        self.state = IDLE
        self.merging: dict[int, int] = {}  # a merging group: split id -> segments arrived
        self.computing = 0.0               # when its call's CPU work began
        self.sends = f"{group.name} {id(self)} calls"   # the backlog of its side of the calls it makes


class _Queue:
    __slots__ = ("jobs", "waiting", "most", "pool", "calls")

    def __init__(self) -> None:
        self.jobs: deque[tuple[_Job, _Replica | None]] = deque()
        self.waiting: deque[_Replica] = deque()
        self.most = 0   # the longest it grew: what back-pressure bounds
        self.pool = 0   # the pool of cores its readers compute on
        self.calls = "calls"   # the backlog of its readers' side of the calls that fill it




class _Job:
    """What travels: the items of one message, and for a segment its split's id and count."""

    __slots__ = ("items", "origin", "count")

    def __init__(self, items: tuple[int, ...], origin: int = -1, count: int = 1) -> None:
        self.items = items
        self.origin = origin
        self.count = count


class _Device:
    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: deque[tuple[_Replica, float, _Job]] = deque()


class Simulation:
    """One run of a pipeline under a load, to the last item; `run()` returns its Prediction."""

    def __init__(self, pipeline: SimPipeline, arrivals: Arrivals, items: int = DEFAULT_ITEMS, warmup: int | None = None,
                 seed: int = 0, percentiles: Sequence[float] = LATENCY_PERCENTILES) -> None:
        self.pipeline = pipeline
        self.percentiles = tuple(sorted(set(percentiles)))
        self.arrivals = arrivals
        self.items = items
        self.warmup = items // 10 if warmup is None else warmup
        self.random = random.Random(seed)
        self.arrival_random = random.Random(seed + 1)   # the same arrivals for every candidate
        self.heap: list[tuple[float, int, Callable[..., None], tuple[object, ...]]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.enqueued = [0.0] * items
        self.finished = [math.nan] * items
        self.done = 0
        self.sent = 0
        self.origins = itertools.count()
        self.devices: dict[int, _Device] = {}
        # One SharedCores per pool; none where the cores are not modelled.
        self.pools = ([SharedCores(cores, self.at, lambda: self.now) for cores in pipeline.pool_cores]
                      if pipeline.cores > 0 else [])
        queues: dict[tuple[int, int | None], _Queue] = {}   # (step reading it, its out_queue index) -> queue
        self.queues = queues
        self.request_queue = queues.setdefault((0, None), _Queue())
        self.replicas: list[_Replica] = []
        for g in pipeline.groups:
            inbox = queues.setdefault((g.step, g.in_queue), _Queue()) if g.step > 0 else self.request_queue
            inbox.pool, inbox.calls = g.pool, f"calls into step {g.step}"
            outs = [queues.setdefault((g.step + 1, q), _Queue()) for q in g.out_queues]
            for device in g.devices:
                self.replicas.append(_Replica(g, device, inbox, outs))
                if device >= 0:
                    self.devices.setdefault(device, _Device())

    # ------------------------------------------------------------ the loop

    def at(self, when: float, action: Callable[..., None], *args: object) -> None:
        heapq.heappush(self.heap, (when, next(self.seq), action, args))

    def run(self) -> Prediction:
        for replica in self.replicas:
            self.go_idle(replica)
        kind = self.arrivals.kind
        if kind == "bulk":
            for _ in range(self.items):
                self.arrive()
        elif kind == "closed":
            for _ in range(min(self.arrivals.concurrency, self.items)):
                self.arrive()
        elif kind == "trace":
            for when in self.arrivals.times[: self.items]:
                self.at(when, self.arrive)
        else:
            self.at(self.arrival_random.expovariate(self.arrivals.rate_per_s), self.arrive_next)
        heap = self.heap
        while heap and self.done < self.items:
            self.now, _, action, args = heapq.heappop(heap)
            action(*args)
        return self.prediction()

    def arrive_next(self) -> None:
        self.arrive()
        if self.sent < self.items:
            self.at(self.now + self.arrival_random.expovariate(self.arrivals.rate_per_s), self.arrive_next)

    def arrive(self) -> None:
        item = self.sent
        self.sent += 1
        self.enqueued[item] = self.now
        self.background(0, "client", self.pipeline.background.client_s)
        self.hand_over(self.request_queue, _Job((item,)), None)

    def background(self, pool: int, backlog: str, work_s: float) -> None:
        """CPU work of a one-core process outside the runners (the client, main, Ray's daemons) on a pool."""
        if self.pools and work_s > 0:
            self.pools[pool].queue(backlog, work_s)

    # ------------------------------------------------------------ queues and replicas

    def hand_over(self, queue: _Queue, job: _Job, producer: _Replica | None) -> None:
        """The item reaches the queue one hop's latency later (at once where none was measured)."""
        if self.pipeline.delivery_s > 0:
            self.at(self.now + self.pipeline.delivery_s, self.put, queue, job, producer)
        else:
            self.put(queue, job, producer)

    def put(self, queue: _Queue, job: _Job, producer: _Replica | None) -> None:
        if self.pipeline.background.call_s > 0 and not any(sender is producer for _, sender in queue.jobs):
            self.actor_call(queue, producer)
        if queue.waiting:
            consumer = queue.waiting.popleft()
            self.take(consumer, job, producer)
        else:
            queue.jobs.append((job, producer))
            queue.most = max(queue.most, len(queue.jobs))

    def actor_call(self, queue: _Queue, producer: _Replica | None) -> None:
        """On Ray an item goes in an actor call of its own unless an item before it from the same producer is
        still untaken: then it rides in the call after that one (rnb.engines.ray.handoffs).  A call costs CPU
        at both ends, the producer's (the client's for a request) and its reader's.

        A profiling job queues every request at once, so the measured step
        took its inputs several to a call and its profile holds a share of
        a call per item; under a load it keeps up with, a step takes one
        call per item whether or not its reader was busy when it came.
        """
        call_s = self.pipeline.background.call_s
        self.background(queue.pool, queue.calls, call_s)
        if producer is None:
            self.background(0, "client", call_s)
        else:
            self.background(producer.group.pool, producer.sends, call_s)

    def go_idle(self, replica: _Replica) -> None:
        """A replica free for its next input: the oldest waiting one, else it waits (and may flush)."""
        queue = replica.queue
        if queue.jobs:
            job, producer = queue.jobs.popleft()
            self.take(replica, job, producer)
            return
        replica.state = IDLE
        replica.token += 1
        queue.waiting.append(replica)
        if replica.pending:
            self.at(self.now + POLL_S, self.poll_expired, replica, replica.token)

    def take(self, replica: _Replica, job: _Job, producer: _Replica | None) -> None:
        replica.state = CALLING
        replica.token += 1
        if producer is not None:   # the consumer copied the input out: the producer's slot is free again
            if self.pipeline.release_s > 0:
                self.at(self.now + self.pipeline.release_s, self.release, producer)
            else:
                self.release(producer)
        g = replica.group
        self.background(g.pool, "daemons", self.pipeline.background.hop_s * len(job.items))
        service = g.service
        if g.batch is not None:
            if not replica.pending:
                replica.first = self.now
            replica.pending.append(job)
            if len(replica.pending) < g.batch:
                self.call(replica, self.sample(service.held or (0.0,)), None)
                return
            out = _Job(tuple(i for pending in replica.pending for i in pending.items))
            replica.pending = []
            self.call(replica, self.emit_time(service, len(out.items), len(service.partial)), out)
            return
        if g.merges and job.origin >= 0:
            arrived = replica.merging.get(job.origin, 0) + 1
            if arrived < job.count:
                replica.merging[job.origin] = arrived
                self.call(replica, self.sample(service.held or service.emit), None)
                return
            del replica.merging[job.origin]
            job = _Job(job.items)
        self.call(replica, self.emit_time(service, len(job.items), len(service.partial)), job)

    def release(self, producer: _Replica) -> None:
        producer.free += 1
        if producer.outbox:
            self.send(producer)

    def sample(self, values: Sequence[float]) -> float:
        return values[int(self.random.random() * len(values))]

    def emit_time(self, service: Service, cards: int, full: int) -> float:
        """An emitting call's time, scaled down for a partial batch (fewer cards than the profiled form)."""
        index = int(self.random.random() * len(service.emit))
        seconds = service.emit[index]
        if 0 < cards < full and service.partial:
            seconds *= service.partial[cards - 1]
        return seconds

    def call(self, replica: _Replica, seconds: float, out: _Job | None) -> None:
        """A call of `seconds` as profiled: its CPU work first (on the shared cores), then the rest of it."""
        replica.busy_s += seconds
        g = replica.group
        cpu_s = g.cpu_fraction * seconds
        if not self.pools or cpu_s <= 0:
            self.off_cpu(replica, seconds, out)
            return
        alone_s = cpu_s / g.profiled_threads    # what the CPU work took in the profile
        replica.computing = self.now
        self.pools[g.pool].run(cpu_s, g.threads, lambda: self.computed(replica, alone_s, max(0.0, seconds - alone_s), out))

    def computed(self, replica: _Replica, alone_s: float, rest_s: float, out: _Job | None) -> None:
        replica.busy_s += (self.now - replica.computing) - alone_s   # stretched (or, on more threads, shortened)
        self.off_cpu(replica, rest_s, out)

    def off_cpu(self, replica: _Replica, seconds: float, out: _Job | None) -> None:
        """The part of a call that holds no core: a sleep, or device work after its launch."""
        if replica.device < 0 or out is None:
            self.at(self.now + seconds, self.called, replica, out)
            return
        # On a GPU the model's part of the call waits for the device, shared with the other replicas on it.
        inside = min(seconds, self.sample(replica.group.service.inside or (seconds,)))
        self.at(self.now + seconds - inside, self.want_device, replica, inside, out)

    def want_device(self, replica: _Replica, inside: float, out: _Job) -> None:
        device = self.devices[replica.device]
        if device.busy:
            device.waiting.append((replica, inside, out))
            return
        device.busy = True
        self.at(self.now + inside, self.device_done, replica, out)

    def device_done(self, replica: _Replica, out: _Job) -> None:
        device = self.devices[replica.device]
        if device.waiting:
            other, inside, other_out = device.waiting.popleft()
            self.at(self.now + inside, self.device_done, other, other_out)
        else:
            device.busy = False
        self.called(replica, out)

    def called(self, replica: _Replica, out: _Job | None) -> None:
        """The call returned: hand the output on (or count it at the final step), then take the next input."""
        if out is not None:
            g = replica.group
            if not g.out_queues:
                self.count(out)
            else:
                if g.splits > 1:
                    if out.origin >= 0:
                        raise EstimateError(f"{g.name} splits segments again; nested segments are not simulated.")
                    origin = next(self.origins)
                    replica.outbox.extend(_Job(out.items, origin, g.splits) for _ in range(g.splits))
                else:
                    replica.outbox.append(out)
                self.send(replica)
                if replica.outbox:
                    replica.state = BLOCKED   # back-pressure: every slot is held by an item not yet taken
                    return
        self.go_idle(replica)

    def send(self, replica: _Replica) -> None:
        """Hand on what the replica holds while it has free slots, each to the queue its turn selects."""
        while replica.outbox and replica.free > 0:
            replica.free -= 1
            queue = replica.outs[replica.rr % len(replica.outs)]
            replica.rr += 1
            self.hand_over(queue, replica.outbox.popleft(), replica)
        if replica.state == BLOCKED and not replica.outbox:
            self.go_idle(replica)

    def poll_expired(self, replica: _Replica, token: int) -> None:
        """An idle Batcher's receive timed out: hand over the partial batch once its first item waited long enough."""
        if token != replica.token or replica.state != IDLE or not replica.pending:
            return
        if self.now - replica.first < replica.group.timeout_s - 1e-9:   # (the runner's own clock has passed it)
            self.at(self.now + POLL_S, self.poll_expired, replica, token)
            return
        replica.queue.waiting.remove(replica)
        replica.state = CALLING
        replica.token += 1
        out = _Job(tuple(i for pending in replica.pending for i in pending.items))
        replica.pending = []
        service = replica.group.service
        self.call(replica, max(0.0, service.mean_emit - service.mean_held), out)  # the write-out, no input to copy

    def count(self, job: _Job) -> None:
        if job.origin >= 0:
            raise EstimateError("a segment reached the final step unmerged; a step after a split must merge.")
        for item in job.items:
            if math.isnan(self.finished[item]):
                self.finished[item] = self.now
                self.done += 1
                self.background(0, "main", self.pipeline.background.main_s)
                self.background(0, "daemons", self.pipeline.background.hop_s)
                if self.arrivals.kind == "closed" and self.sent < self.items:
                    self.arrive()

    # ------------------------------------------------------------ what it measured

    def prediction(self) -> Prediction:
        enqueued = np.array(self.enqueued[self.warmup:])
        finished = np.array(self.finished[self.warmup:])
        done = ~np.isnan(finished)
        latency = (finished[done] - enqueued[done]) * 1000.0
        duration = float(finished[done].max() - enqueued.min()) if done.any() else 0.0
        throughput = float(done.sum()) / duration if duration > 0 else 0.0
        percentiles = {q: float(np.percentile(latency, q)) if latency.size else math.inf for q in self.percentiles}
        elapsed = max(self.now, 1e-9)
        busy: dict[str, list[float]] = {}
        for replica in self.replicas:
            busy.setdefault(replica.group.name, []).append(min(1.0, replica.busy_s / elapsed))
        cores_busy = max((min(1.0, pool.used_s / (pool.cores * elapsed)) for pool in self.pools), default=None)
        return Prediction(self.arrivals, throughput, percentiles, float(latency.mean()) if latency.size else math.inf,
                          {name: sum(values) / len(values) for name, values in busy.items()}, int(done.sum()),
                          cores_busy)


def simulate(pipeline: SimPipeline, arrivals: Arrivals, items: int = DEFAULT_ITEMS, seed: int = 0,
             percentiles: Sequence[float] = LATENCY_PERCENTILES, warmup: int | None = None) -> Prediction:
    """One simulation; `warmup` items (default a tenth) are left out of its figures, as a job's are."""
    return Simulation(pipeline, arrivals, items, warmup, seed, (*LATENCY_PERCENTILES, *percentiles)).run()


# Fractions of the capacity the peak search tries from the top down before it bisects: latency need not
# rise with the rate (a Batcher's partial batches wait for its timeout at low rates), so the search
# looks for the highest rate that meets the bound, not the lowest that breaks it.
SCAN_FRACTIONS: tuple[float, ...] = (0.98, 0.9, 0.8, 0.65, 0.5, 0.35, 0.2, 0.1, 0.05)


def peak_rate(pipeline: SimPipeline, bound_ms: float, percentile: float, items: int = DEFAULT_ITEMS, seed: int = 0,
              max_steps: int = 6, rel_tol: float = 0.02) -> PeakEstimate:
    """The highest Poisson rate whose predicted percentile stays under the bound.

    Rates are tried down from the capacity until one meets the bound; the
    sweep's own bisection (over simulations instead of jobs) then narrows
    the step between it and the failing rate above it.
    """
    capacity = pipeline.capacity_per_s()
    runs: dict[float, Prediction] = {}

    def measure(rate: float) -> Trial:
        if rate not in runs:
            runs[rate] = simulate(pipeline, Arrivals.poisson(rate), items, seed, (percentile,))
        return Trial(rate, runs[rate].percentile_ms(percentile))

    above = None
    for fraction in SCAN_FRACTIONS:
        rate = fraction * capacity
        if measure(rate).latency_ms < bound_ms:
            break
        above = rate
    else:
        return PeakEstimate(None, None, runs[min(runs)], capacity)
    if above is None:   # even 98% of the capacity meets the bound
        return PeakEstimate(rate, runs[rate], runs[min(runs)], capacity)
    result = bisect_rate(measure, rate, above, bound_ms, max_steps, rel_tol)
    best = result.best.rate_per_s if result.best is not None else rate
    return PeakEstimate(best, runs[best], runs[min(runs)], capacity)


class Estimator:
    """Predictions for the candidates of one space, each simulated once: what the search consults."""

    def __init__(self, space: TuneSpace, profiles: Mapping[ProfileKey, Profile], bench: Bench, bound_ms: float,
                 percentile: float, items: int = DEFAULT_ITEMS, seed: int = 0) -> None:
        self.space = space
        self.profiles = profiles
        self.bench = bench
        self.bound_ms = bound_ms
        self.percentile = percentile
        self.items = items
        self.seed = seed
        self._peaks: dict[Candidate, PeakEstimate] = {}

    def pipeline(self, candidate: Candidate) -> SimPipeline:
        return pipeline_of(self.space, candidate, self.profiles, self.bench)

    def peak(self, candidate: Candidate) -> PeakEstimate:
        if candidate not in self._peaks:
            self._peaks[candidate] = peak_rate(self.pipeline(candidate), self.bound_ms, self.percentile,
                                               self.items, self.seed)
        return self._peaks[candidate]

    def at(self, candidate: Candidate, arrivals: Arrivals, items: int | None = None,
           warmup: int | None = None) -> Prediction:
        """One simulation of a candidate; `items` and `warmup` as a job's -v and --warmup, to compare with it."""
        return simulate(self.pipeline(candidate), arrivals, items or self.items, self.seed, (self.percentile,), warmup)
