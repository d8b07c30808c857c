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
again.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from rnb.analysis.jobs import Job, JobLogError, read_job
from rnb.analysis.sweep import RunOutcome, SweepError
from rnb.core.joblog import host
from rnb.core.records import JsonObject
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.engines.registry import DAEMON_SAMPLES
from rnb.pipeline.config import merges_segments, parse_config
from rnb.pipeline.plan import Placement, plan_runners, runner_name
from rnb.tune.cores import HostCores, host_cores, with_others
from rnb.tune.hosts import HostPools
from rnb.tune.space import Candidate, GroupChoices, TuneSpace, digest

log = logging.getLogger(__name__)

FEEDER = "rnb.tune.instruments.Feeder"
SINK = "rnb.tune.instruments.Sink"
TRIM_FRACTION = 0.1     # calls dropped at each end of a profiling job: start-up and the last partial batch
PROFILE_SLOTS = 4       # output slots of the feeder and the Batcher in a profiling job
MIN_CALLS = 5           # fewer measured calls than this make no distribution
# A profiling job samples its processes' CPU this often (benchmark.py --sample-interval-ms): its calls kept
# span a fraction of a second, and its CPU per call is read between the samples on either side.
SAMPLE_INTERVAL_MS = 25
# How profiles are read off their jobs; a cached profile read another way is measured again. 2: the first
# call kept after the trimmed start no longer counts its wait behind the trimmed calls as service. 3: the CPU
# that the runner, the harness's hops, the client and main spent, and the host's cores in the key. 4: the CPU
# of Ray's daemons per item and hop. 5: the latency of the hop from the measured step to the sink.
PROFILE_VERSION = 5


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


def forms_of(space: TuneSpace, candidate: Candidate) -> dict[tuple[int, int], Form]:
    """The form of every group's calls in one candidate (only its batches and segments matter).

    A Batcher is profiled the way it runs in front of the group it feeds:
    whole items in, its batches split as they reach that group; its form
    says so (segments 1, splits = the segments its batches arrive in).
    """
    produced: dict[int, tuple[int, int]] = {}    # out_queue of the previous step -> (cards, segments) of a message
    forms: dict[tuple[int, int], Form] = {}
    for k, step in enumerate(space.config.steps):
        written: dict[int, tuple[int, int]] = {}
        splits = candidate.steps[k].segments
        merges = merges_segments(step.model)
        for gi, group in enumerate(step.queue_groups):
            cards, segments = (1, 1) if group.in_queue is None else produced[group.in_queue]
            batch = candidate.group(k, gi).batch
            forms[(k, gi)] = Form(cards, segments, splits) if batch is None else Form(cards, 1, segments * splits, batch)
            batch = batch or 1
            out = (cards * batch, (1 if merges else segments) * splits)
            for q in group.out_queues:
                written[q] = max(written.get(q, out), out)
        produced = written
    return forms


def all_forms(space: TuneSpace, candidates: Iterable[Candidate]) -> dict[tuple[int, int], set[Form]]:
    needed: dict[tuple[int, int], set[Form]] = {}
    for candidate in candidates:
        for where, form in forms_of(space, candidate).items():
            needed.setdefault(where, set()).add(form)
    return needed


def form_candidates(space: TuneSpace) -> list[Candidate]:
    """One candidate per combination of batches and segments: between them, every form any candidate has."""
    batchers = space.batcher_groups
    result = []
    for batch_values in itertools.product(*(g.batches for g in batchers)):
        batches = {(g.step, g.group): b for g, b in zip(batchers, batch_values)}
        for segments in itertools.product(*space.segments):
            result.append(space.candidate({(g.step, g.group): 1 for g in space.tuned_groups}, batches, segments))
    return result


def unit_plan(space: TuneSpace) -> list[Placement]:
    """The plan of the config with every Batcher at batch 1 and no segments: each group's per-item input.

    Only the first replica of each group, which is all a profile needs to know.
    """
    steps = []
    for step in space.config.steps:
        groups = tuple(dataclasses.replace(g, model_kwargs={**g.model_kwargs, "batch": 1})
                       if "batch" in g.model_kwargs else g for g in step.queue_groups)
        steps.append(dataclasses.replace(step, queue_groups=groups, num_segments=1))
    return [p for p in plan_runners(dataclasses.replace(space.config, steps=tuple(steps)), 1) if p.instance == 0]


def profile_key(space: TuneSpace, plan: Sequence[Placement], g: GroupChoices, form: Form, bench: Bench) -> ProfileKey:
    """The key of a group's profile at a form: what the profiler stores and the estimator looks up."""
    group = space.config.steps[g.step].queue_groups[g.group]
    keywords = json.dumps({k: v for k, v in group.model_kwargs.items() if k != "batch" or g.kind == "work"},
                          sort_keys=True, default=str)
    shapes = next(p.input_shapes for p in plan if (p.step, p.group) == (g.step, g.group))
    return ProfileKey(g.model, keywords, form, json.dumps(shapes), bench.device_kind, bench.engine, bench.host,
                      bench.cores)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_profiles(space: TuneSpace, bench: Bench, calls: int,
                  candidates: Sequence[Candidate] | None = None) -> list[ProfileJob]:
    """The profiling jobs every form of every work group needs (a Batcher is measured with the group it feeds)."""
    plan = unit_plan(space)
    needed = all_forms(space, form_candidates(space) if candidates is None else candidates)
    return [_profile_job(space, plan, g, form, bench, calls)
            for g in space.groups if g.kind == "work"
            for form in sorted(needed[(g.step, g.group)], key=dataclasses.astuple)]


def _profile_job(space: TuneSpace, plan: Sequence[Placement], g: GroupChoices, form: Form, bench: Bench,
                 calls: int) -> ProfileJob:
    """A feeder, the Batcher in front of the group (when it takes batches), the group, a sink."""
    config = space.config
    step = config.steps[g.step]
    group = step.queue_groups[g.group]
    final = g.step == space.num_steps - 1
    device = [bench.device]
    batcher = space.batcher_of(g)
    pipeline: list[dict[str, object]] = []
    if g.step > 0:
        producer = next(p for p in plan if p.step == g.step - 1 and group.in_queue in p.out_queues)
        shapes = next(p.input_shapes for p in plan if (p.step, p.group) == (g.step, g.group)) or ()
        pipeline.append({"model": FEEDER, "queue_groups": [{"gpus": device, "out_queues": [0]}],
                         "num_shared_tensors": PROFILE_SLOTS, "shapes": [list(s) for s in shapes],
                         "dtypes": [_dtype_name(d) for d in producer.output_dtypes]})
        # A group further down a batched pipeline gets its batches from a Batcher like the nearest one upstream
        # (its model and keywords, its timeout among them).
        lender = batcher or next((b for b in reversed(space.batcher_groups) if b.step < g.step), None)
        if lender is not None and (batcher is not None or form.cards > 1):
            kwargs = dict(config.steps[lender.step].queue_groups[lender.group].model_kwargs)
            pipeline.append({"model": config.steps[lender.step].model,
                             "queue_groups": [{"gpus": device, "in_queue": 0, "out_queues": [0]}],
                             "num_shared_tensors": PROFILE_SLOTS, **kwargs, "batch": form.cards})
        pipeline[-1]["num_segments"] = form.segments
    measured: dict[str, object] = {"model": step.model, **dict(group.model_kwargs),
                                "queue_groups": [{"gpus": device, **({"in_queue": 0} if pipeline else {}),
                                                  **({} if final else {"out_queues": [0]})}]}
    if not final:
        measured.update(num_shared_tensors=step.num_shared_tensors, num_segments=form.splits)
    pipeline.append(measured)
    if not final:
        pipeline.append({"model": SINK, "queue_groups": [{"gpus": device, "in_queue": 0}]})
    batcher_key = None
    if batcher is not None:
        batcher_key = profile_key(space, plan, batcher, Form(1, 1, form.segments, form.cards), bench)
    what = g.name + "".join(f" {name} {value}" for name, value in (
        ("at batch", form.cards), ("with segments", form.segments), ("split in", form.splits)) if value != 1)
    document = {"description": f"rnb-tune profile of {what} ({step.model})",
                "source": dict(config.source) if g.step == 0 else {"synthetic": True}, "pipeline": pipeline}
    return ProfileJob(g, form, profile_key(space, plan, g, form, bench), document, calls * form.cards,
                      len(pipeline) - (1 if final else 2), batcher_key, what)


# ---------------------------------------------------------------- reading a profiling job

@dataclass(frozen=True)
class Call:
    """One model call of one runner, as its time cards recorded it."""

    arrived: float       # when its input reached the queue (the producer's hand-over, or the enqueue)
    taken: float         # runner_start
    started: float       # inference_start
    finished: float      # inference_finish: when the output left the model (for a held call: its batch's)
    slot_wait: float
    handed_over: float
    cards: int


def calls_of(job: Job, step: int) -> dict[int, list[Call]]:
    """The calls of every replica (by instance) of group 0 of `step`, each replica's in the order taken.

    Items that travelled in segments are read from each segment's own
    columns (`seg{i}_...`), so a call is a segment's call; the cards of one
    call share its `runner{step}_start`.
    """
    table = job.timings
    events = StepEvents(step)
    before = ENQUEUE if step == 0 else StepEvents(step - 1).handed_over
    prefixes = sorted({name[: -len(events.arrived)] for name in table.column_names
                       if name.startswith("seg") and name.endswith("_" + events.arrived)}) or [""]
    members: dict[tuple[int, float], list[tuple[float, ...]]] = {}
    for prefix in prefixes:
        def column(name: str) -> np.ndarray:
            for found in (prefix + name, name):   # a segment's own record, else what the item shares
                if found in table.column_names:
                    return table.column(found).to_numpy(zero_copy_only=False).astype(float)
            return np.full(table.num_rows, np.nan)
        times = [column(name) for name in (before, events.arrived, events.started, events.finished,
                                           events.slot_acquired, events.handed_over)]
        instances = column(f"instance{step}")
        for i in range(table.num_rows):
            row = tuple(float(values[i]) for values in times)
            if math.isnan(row[1]) or math.isnan(row[5]):
                continue
            replica = 0 if math.isnan(instances[i]) else int(instances[i])
            members.setdefault((replica, row[1]), []).append(row)
    by_replica: dict[int, list[Call]] = {}
    for (replica, _), rows in members.items():
        _, taken, started, finished, slot, handed = rows[0]
        wait = 0.0 if math.isnan(slot) else max(0.0, slot - finished)
        by_replica.setdefault(replica, []).append(
            Call(max(row[0] for row in rows), taken, started, finished, wait, handed, len(rows)))
    for calls in by_replica.values():
        calls.sort(key=lambda call: call.taken)
    return by_replica


def occupancy(calls: Sequence[Call], skip: int = 0) -> tuple[list[float], list[float], list[float], list[int]]:
    """Each call's occupancy of its runner, split into emitting and held calls (see the module's docstring).

    The first and last `skip` calls are left out of what is returned, yet
    still say when the runner became free: the first call kept must not
    count the wait behind the calls before it as its own service.

    A replica that holds inputs (a Batcher) also hands some batches on from
    `flush`, once its input has been idle for a poll interval: the output
    then leaves long after the last call returned, and the runner was idle,
    not busy, meanwhile.  Such a call counts as a held call (its copy-in),
    and the flush itself as no call: the estimator plays the Batcher's policy.

    Returns (emit seconds, held seconds, inside seconds of the emitting calls,
    cards of the emitting calls).
    """
    emit: list[float] = []
    held: list[float] = []
    inside: list[float] = []
    cards: list[int] = []
    later = [call.taken for call in calls[1:]] + [math.inf]
    holding = any(call.finished > after for call, after in zip(calls, later))
    free = -math.inf
    for index, (call, after) in enumerate(zip(calls, later)):
        holds = call.finished > after   # the next call was taken before this one's output left
        flushed = holding and not holds and call.finished - call.started >= POLL_S
        left = call.started if holds or flushed else call.handed_over - call.slot_wait
        service = left - max(free, call.arrived)
        free = call.started if holds else call.handed_over
        if service < 0 or not skip <= index < len(calls) - skip:
            continue
        if holds or flushed:
            held.append(service)
        else:
            emit.append(service)
            inside.append(max(0.0, call.finished - call.started))
            cards.append(call.cards)
    return emit, held, inside, cards


def read_profile(job: Job, key: ProfileKey, position: int, cards: int | None = None,
                 others_cores: float = 0.0) -> Profile:
    """The profile of the group at `position` of a finished profiling job.

    The first and last TRIM_FRACTION of its calls are left out (start-up,
    the last partial batch); `cards` keeps only emitting calls of that many
    items (a batch filled), where the group takes batches.
    """
    if job.meta.termination_reason != Termination.TARGET_REACHED.reason:
        raise ProfileError(f"its job {job.path} ended with {job.meta.termination_reason!r}: "
                           f"{job.meta.error or 'no error recorded'}")
    replica = calls_of(job, position).get(0, [])
    cut = int(len(replica) * TRIM_FRACTION)
    emit, held, inside, sizes = occupancy(replica, skip=cut)
    kept = [i for i, n in enumerate(sizes) if cards is None or n == cards]
    if len(kept) < MIN_CALLS:
        raise ProfileError(f"its job {job.path} left {len(kept)} full calls of step {position}, fewer than the "
                           f"{MIN_CALLS} a profile needs; give a larger --profile-calls.")
    process = next((p for p in job.meta.processes if p.name == runner_name(position, 0, 0)), None)
    rss = None if process is None else process.peak_rss_bytes
    device = None if process is None else process.device_process_bytes or process.peak_device_bytes
    placement = _placement(job, position)
    threads = placement.threads or key.cores.affinity   # a GPU runner keeps torch's default: every core
    cpu = cpu_use(job, position, replica[cut: len(replica) - cut], sum(emit) + sum(held), threads, others_cores)
    alone = 1.0 - cpu.waited
    return Profile(key, tuple(alone * emit[i] for i in kept), tuple(alone * s for s in held),
                   tuple(alone * inside[i] for i in kept), _slot_bytes(job, placement), rss, device, str(job.path), cpu,
                   sink_hop_s(job.timings, job.num_steps) if position == job.num_steps - 2 else 0.0)


def _placement(job: Job, position: int) -> Placement:
    """The measured runner as the profiling job planned it (its output slots, its threads)."""
    config = parse_config(job.config, str(job.path / "config.json"))
    return next(p for p in plan_runners(config, 1) if p.step == position)


def _slot_bytes(job: Job, placement: Placement) -> int:
    """Bytes of one output slot of the measured step, from its plan in the job's own config."""
    if placement.step >= job.num_steps - 1:
        return 0
    dtypes = placement.output_dtypes or (torch.float32,) * len(placement.output_shapes)
    return int(sum(math.prod(s) * torch.empty((), dtype=d).element_size() for s, d in zip(placement.output_shapes, dtypes)))


def cpu_spent(samples: pa.Table, process: str, start: float, end: float, column: str = "cpu_s") -> float | None:
    """Seconds of a cumulative column (CPU, or the wait for a core) a process added between two times,
    interpolated between its samples.

    None where it has fewer than two samples, or none on both sides of the
    window (an edge the samples do not reach would be read as nothing), or
    the column was not kept.
    """
    if column not in samples.column_names:
        return None
    mine = np.array([name == process for name in samples.column("process").to_pylist()], dtype=bool)
    times = samples.column("time").to_numpy(zero_copy_only=False).astype(float)[mine]
    seconds = samples.column(column).to_numpy(zero_copy_only=False).astype(float)[mine]
    if times.size < 2 or end <= start or np.isnan(seconds).any():
        return None
    start, end = max(start, float(times[0])), min(end, float(times[-1]))
    if end <= start:
        return None
    return float(np.interp(end, times, seconds) - np.interp(start, times, seconds))


def cpu_use(job: Job, position: int, kept: Sequence[Call], busy_s: float, threads: int,
            others_cores: float = 0.0) -> CpuUse:
    """What the profiling job's processes spent on the CPU (see CpuUse); zeros where it has no samples."""
    samples = job.samples
    if samples is None or not kept or busy_s <= 0:
        return CpuUse(threads=threads, others_cores=others_cores)
    name, window = runner_name(position, 0, 0), (kept[0].taken, kept[-1].handed_over)
    runner = cpu_spent(samples, name, *window) or 0.0
    waited = min(0.9, (cpu_spent(samples, name, *window, column="run_wait_s") or 0.0) / busy_s)
    busy_s *= 1.0 - waited
    enqueued = job.timings.column(ENQUEUE).to_numpy(zero_copy_only=False).astype(float)
    finished = job.timings.column(StepEvents(job.num_steps - 1).handed_over).to_numpy(zero_copy_only=False).astype(float)
    items = max(1, job.timings.num_rows)
    start, end = float(np.nanmin(enqueued)), float(np.nanmax(finished))

    def per_item(process: str) -> float:
        return (cpu_spent(samples, process, start, end) or 0.0) / items

    hop = runner_name(position + 1, 0, 0) if position < job.num_steps - 1 else runner_name(0, 0, 0)
    return CpuUse(fraction=runner / busy_s, per_call_s=runner / len(kept), threads=threads, waited=waited,
                  hop_per_item_s=per_item(hop) if hop != name else 0.0, client_per_item_s=per_item("client"),
                  main_per_item_s=per_item("main"),
                  daemons_per_hop_s=daemons_per_hop_s(samples, start, end, items, job.num_steps + 1),
                  others_cores=others_cores)


def daemons_per_hop_s(samples: pa.Table, start: float, end: float, items: int, hops: int) -> float:
    """CPU seconds per item and hop of the Ray cluster's processes that a job sampled (0 on the local engine).

    A daemon that started or stopped inside the window counts only where
    its samples reach (cpu_spent).
    """
    daemons = {process for process in samples.column("process").to_pylist()
               if process is not None and process.startswith(DAEMON_SAMPLES)}
    spent = sum(cpu_spent(samples, daemon, start, end) or 0.0 for daemon in daemons)
    return spent / max(1, items) / max(1, hops)


def sink_hop_s(timings: pa.Table, num_steps: int) -> float:
    """The median time from a profiling job's hand-over to its sink (its last step) to the sink's take.

    The sink does nothing, so it waits for each item rather than the item
    for it: what is left is the hop itself.  On the local engine that is
    a queue in shared memory (tenths of a millisecond); on Ray an actor
    call, milliseconds on a busy host, which the estimator adds to every
    hop (rnb.tune.estimate).
    """
    handed, taken = StepEvents(num_steps - 2).handed_over, StepEvents(num_steps - 1).arrived
    if handed not in timings.column_names or taken not in timings.column_names:
        return 0.0
    gaps = (timings.column(taken).to_numpy(zero_copy_only=False).astype(float)
            - timings.column(handed).to_numpy(zero_copy_only=False).astype(float))
    gaps = gaps[~np.isnan(gaps)]
    return max(0.0, float(np.median(gaps))) if gaps.size else 0.0


# ---------------------------------------------------------------- the cache

class ProfileCache:
    """DIR/profiles/: one JSON file per profile key, written whole or not at all."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: ProfileKey) -> Path:
        return self.root / f"{key.digest}.json"

    def get(self, key: ProfileKey) -> Profile | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("version") != PROFILE_VERSION:
                return None
            profile = Profile.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None   # a file from another version, or damaged: measure again
        return profile if profile.key == key else None

    def put(self, profile: Profile) -> None:
        write_json_atomic(self.path(profile.key), {"version": PROFILE_VERSION, **profile.to_json()})


def write_json_atomic(path: Path, document: object) -> None:
    """Write a JSON file so that a reader (or a Ctrl-C) sees it whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    os.replace(partial, path)


Runner = Callable[[Path, int], RunOutcome]   # (config file, -v) -> the job it left


def profile_all(jobs: Sequence[ProfileJob], cache: ProfileCache, run: Runner,
                progress: Callable[[ProfileJob, bool], None] = lambda job, cached: None) -> dict[ProfileKey, Profile]:
    """Every job's profiles, from the cache where they are, else measured (and cached at once).

    A job whose profile is cached is not run; a Batcher measured with the
    group it feeds is cached under its own key in the same pass.
    """
    profiles: dict[ProfileKey, Profile] = {}
    for job in jobs:
        keys = (job.key,) if job.batcher_key is None else (job.key, job.batcher_key)
        cached = {key: cache.get(key) for key in keys}
        if all(profile is not None for profile in cached.values()):
            profiles.update({key: profile for key, profile in cached.items() if profile is not None})
            progress(job, True)
            continue
        config_path = cache.root / "configs" / f"{job.key.digest}.json"
        write_json_atomic(config_path, job.document)
        try:
            outcome, others = with_others(lambda: run(config_path, job.videos))
        except SweepError as error:
            raise ProfileError(f"profiling {job.what} ({job.key.model}) failed: {error}") from None
        try:
            measured = read_job(outcome.job_dir)
            profile = read_profile(measured, job.key, job.position, job.form.cards, others)
            batcher = (None if job.batcher_key is None
                       else read_profile(measured, job.batcher_key, job.position - 1, None, others))
        except (ProfileError, JobLogError) as error:
            raise ProfileError(f"profiling {job.what} ({job.key.model}) failed: {error}") from None
        for one in (profile, batcher):
            if one is not None:
                cache.put(one)
                profiles[one.key] = one
        progress(job, False)
    return profiles
