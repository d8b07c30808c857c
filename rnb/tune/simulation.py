"""The event loop: one run of a pipeline under a load, event by event, to the last item."""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from rnb.core.termination import POLL_S  # the runner's receive timeout: an idle Batcher may flush after it
from rnb.tune.cores import SharedCores
from rnb.tune.sim_records import (
    DEFAULT_ITEMS,
    LATENCY_PERCENTILES,
    Arrivals,
    EstimateError,
    Prediction,
    Service,
    SimGroup,
    SimPipeline,
)

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
