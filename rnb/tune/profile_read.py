"""A finished profiling job read into a profile: each call's occupancy from the time cards, CPU from the samples."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from rnb.analysis.job_dirs import Job
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.engines.registry import DAEMON_SAMPLES
from rnb.pipeline.config import parse_config
from rnb.pipeline.plan import Placement, plan_runners, runner_name
from rnb.tune.profile import CpuUse, Profile, ProfileError, ProfileKey

TRIM_FRACTION = 0.1     # calls dropped at each end of a profiling job: start-up and the last partial batch
MIN_CALLS = 5           # fewer measured calls than this make no distribution


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
    """Each call's occupancy of its runner, split into emitting and held calls (see rnb.tune.profile's docstring).

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
