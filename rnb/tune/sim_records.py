"""The estimator's records: the load it offers, a candidate pipeline as the simulation sees it, and what it predicts."""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rnb.load import LoadSettings, mode_of

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
