"""Profile: each step alone, through the harness, at every input form a candidate can give it.

A profiling job is an ordinary benchmark job of a short pipeline built
around one queue group of the config: a feeder (rnb.tune.instruments) that
hands it inputs of its real shapes, the Batcher in front of it when it takes
batches, the group itself with its keywords, and a sink.  All requests are
queued at once, so the measured step sets the pace; its profile then holds
the harness's own cost of a hop as well as the model's.

What is measured is a runner's *occupancy* per call, read from the time
cards: for a single server, a call that arrives at A after the previous one
left at D' leaves at D = max(D', A) + S, so S = D - max(D', A), minus the
time spent waiting for a free output slot (that is the next step's doing).
A holding call (a Batcher keeping an item for its batch) leaves when its
model call returns, and its occupancy is kept apart from the calls that hand
an output on.  The distribution is kept, not only the mean: the estimator
samples it.

Profiles are cached in DIR/profiles/, one JSON file per key: the model, its
keywords, the input form, the per-item input shapes, the device kind, the
engine and the host.  A second run with the same arguments measures nothing
aga

Its jobs live apart: here the records (a profile, its key, the form it is
measured at, the bench it is measured on); rnb.tune.profile_plan (the
forms a space's candidates give each group, and the profiling job of
each); rnb.tune.profile_read (a finished profiling job read into a
profile); rnb.tune.profile_cache (the cache, and running what it lacks).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnb.core.joblog import host
from rnb.core.records import JsonObject
from rnb.tune.cores import HostCores, host_cores
from rnb.tune.hosts import HostPools
from rnb.tune.space import GroupChoices, digest

# A profiling job samples its processes' CPU this often (benchmark.py --sample-interval-ms): its calls kept
# span a fraction of a second, and its CPU per call is read between the samples on either side.
SAMPLE_INTERVAL_MS = 25


class ProfileError(RuntimeError):
    """A step that could not be profiled (its job failed, or left too few calls); one sentence."""


@dataclass(frozen=True)
class Form:
    """How a group's calls look in one candidate: what a profile is measured at.

    `cards` items reach it per call (the batch of the Batcher upstream),
    each in `segments` segments (1 = whole items); it splits each output
    into `splits` segments (its step's num_segments); a Batcher group
    stacks `batch` of its inputs.
    """

    cards: int = 1
    segments: int = 1
    splits: int = 1
    batch: int = 1


@dataclass(frozen=True)
class ProfileKey:
    """Everything a profile depends on; its hash names the cache file."""

    model: str
    keywords: str          # the group's model keywords as sorted JSON, its batch excepted
    form: Form
    input_shapes: str      # per-item input shapes as JSON ("null" on step 0)
    device_kind: str       # "cpu", or the GPU's name
    engine: str
    host: str
    cores: HostCores       # the host's cores where it was measured

    @property
    def digest(self) -> str:
        return digest(self, 16)


@dataclass(frozen=True)
class Bench:
    """Where profiles are measured: what part of their key does not come from the step itself."""

    device_kind: str       # "cpu", or the GPU's name
    engine: str            # an rnb.engines.registry name
    device: int = -1       # where the profiled runners go: -1, or the first GPU of the budget
    host: str = dataclasses.field(default_factory=host)
    cores: HostCores = dataclasses.field(default_factory=host_cores)
    hosts: HostPools = HostPools()   # on Ray, which cores each node label's runners compute on


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds a profiling job's processes spent (each process's own, all its threads), from its samples.

    The measured runner's are per second of its occupancy over the calls
    kept: a call's CPU seconds are its occupancy times `fraction`, which a
    step that sleeps or waits on a device keeps near 0 and a step that
    computes on one thread near 1.  The time its main thread waited for a
    core while it could run (`waited`, a share of its occupancy) is taken
    out of the profile's calls: they are the step's on free cores, and the
    estimator shares the cores again as each candidate would.  The others
    are per item of the job: the harness's own cost of a hop (a runner
    whose model does nothing), the client's and main's, and on Ray the
    daemons' per item and hop (the job's hops: one into each step, one
    to main); and the cores that
    other work on the host used while the job ran, recorded for the reader
    (the report shows it), not modelled: the kernel shares the cores
    fairly, so what others used beside a job is not what they would take
    from a candidate.
    """

    fraction: float = 0.0           # the runner's CPU seconds per second of its occupancy (above 1: several threads)
    per_call_s: float = 0.0         # its mean CPU seconds per call kept
    threads: int = 1                # its intra-op threads in the profiling job
    waited: float = 0.0             # the share of its occupancy it waited for a core (removed from the calls)
    hop_per_item_s: float = 0.0     # the sink's CPU per item (the feeder's on the final step): one hop and one call
    client_per_item_s: float = 0.0
    main_per_item_s: float = 0.0
    daemons_per_hop_s: float = 0.0  # Ray's daemons on this host (raylet, GCS, agents) per item and hop
    others_cores: float = 0.0       # cores that other work on the host used, on average, while the job ran


@dataclass(frozen=True)
class Profile:
    """One group measured alone at one form: seconds a call occupies its runner, and its memory."""

    key: ProfileKey
    emit_s: tuple[float, ...]      # calls that handed an output on (every call of a step that holds nothing)
    held_s: tuple[float, ...]      # calls that kept their input (a Batcher filling its batch); () otherwise
    inside_s: tuple[float, ...]    # the model call's own part of each emitting call: the device's share
    output_bytes: int              # one output slot's bytes (0 on the final step)
    peak_rss_bytes: int | None
    peak_device_bytes: int | None  # what NVML saw the runner hold on its GPU (its CUDA context included)
    job_dir: str
    cpu: CpuUse = CpuUse()
    hop_latency_s: float = 0.0     # its job's hop into the sink (sink_hop_s); 0 where the sink does not follow it

    @property
    def mean_emit_s(self) -> float:
        return float(np.mean(self.emit_s))

    @property
    def mean_held_s(self) -> float:
        return float(np.mean(self.held_s)) if self.held_s else 0.0

    def to_json(self) -> JsonObject:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Profile:
        key = dict(data["key"])
        key["form"] = Form(**key["form"])
        key["cores"] = HostCores(**key["cores"])
        return Profile(key=ProfileKey(**key), emit_s=tuple(data["emit_s"]), held_s=tuple(data["held_s"]),
                       inside_s=tuple(data["inside_s"]), output_bytes=int(data["output_bytes"]),
                       peak_rss_bytes=data["peak_rss_bytes"], peak_device_bytes=data["peak_device_bytes"],
                       job_dir=str(data["job_dir"]), cpu=CpuUse(**data["cpu"]),
                       hop_latency_s=float(data["hop_latency_s"]))


@dataclass(frozen=True)
class ProfileJob:
    """One profiling job to run: the config of its short pipeline, and what it measures."""

    group: GroupChoices
    form: Form
    key: ProfileKey
    document: Mapping[str, object]     # the config, for json.dumps
    videos: int
    position: int                        # the measured group's step in the profiling pipeline
    batcher_key: ProfileKey | None       # the Batcher group measured in the same job, at `position - 1`
    what: str                            # for progress lines and errors: "step 2 at batch 4"
