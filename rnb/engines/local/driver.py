"""The local engine's driver: one job on this host, who spawns whom, and what flows where.

    main process (run_job) ── builds Plumbing (queues, flag, start gate) and every runner's SharedSlots
      │ spawns (rnb.engines.local.shared_memory_transport: client_main, runner_main)
      ▼
    client ──Request──▶ step 0 runners ──Signal──▶ step 1 runners ... ──▶ final step
     (rnb.engines.client)  (rnb.engines.runner, the same loop at every step)        │
                                                                                   │ Results
    main process ◀── Ready, Failed, Exited from every child ◀──────────────────────┘

The start time is taken when every child has reported ready (the start
barrier), the end time when the termination flag is raised (the final step
counting the target, a failure, or the main process itself: a stall or the
maximum duration, rnb.engines.stall).  The job's log is opened and closed by
the engine-neutral ends in rnb.engines.job.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from multiprocessing.context import BaseContext, ForkServerContext

import torch

from rnb.core.progress import CELLS, ClientCells, Progress, empty_cells
from rnb.core.records import GpuRecord, MainGpuMemory, ProcessRecord
from rnb.core.termination import POLL_S, Termination
from rnb.engines.client import ClientSpec
from rnb.engines.drivers import EngineJob
from rnb.engines.job import JobBook, JobEnding, JobResult, RunArgs, close_job, open_job_dir
from rnb.engines.lifecycle import JobLife
from rnb.engines.local.lifeline import children_context, end_fork_server
from rnb.engines.local.plumbing import Plumbing, SharedSlot
from rnb.engines.local.shared_memory_transport import DeviceFirst, LocalWiring, client_main, runner_main
from rnb.engines.local.supervisor import Supervisor
from rnb.engines.sampler import SampledGpu
from rnb.engines.spool import TimingsSpool
from rnb.engines.stall import Stall
from rnb.engines.stopping import STOPS
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.gpus import DEVICE_ORDER, device_memory_record
from rnb.pipeline.plan import Placement, slot_bytes, with_device_uuids

log = logging.getLogger(__name__)

# How long the children of a stalled job get to leave on their own (the stalled one is killed at once): those that
# are not stuck leave within a poll interval of the flag.
STALLED_GRACE_S = 1.0
# How long a child's start under way when a stop comes may take to finish: against a running fork server it takes
# milliseconds, so one still going waits for the server's imports, and the server is ended under it.
SPAWN_GRACE_S = 0.5


def run(job: EngineJob) -> JobResult:
    """The local engine's entry in rnb.engines.registry: the command checked the GPUs on this host."""
    return run_job(job.config, job.args, job.placements, job.gpus)


def run_job(config: PipelineConfig, args: RunArgs, placements: list[Placement], gpus: Sequence[GpuRecord]) -> JobResult:
    """Spawn, start everyone together, wait for the flag, stop everyone, release the slots, write the log."""
    ctx = children_context(config.raw)
    for key, value in DEVICE_ORDER.items():  # the children inherit it: CUDA numbers the GPUs as NVML does
        os.environ.setdefault(key, value)
    placements = with_device_uuids(placements, {gpu.logical_index: gpu.uuid for gpu in gpus})
    job_dir = open_job_dir(config, args)
    life = JobLife(job_dir, args, len(config.steps), [p.name for p in placements],
                   [SampledGpu(gpu.logical_index, gpu.physical_index) for gpu in gpus])
    on_cuda = any(p.output_shapes and torch.device(p.output_device).type == "cuda" for p in placements)
    try:
        plumbing, wirings = build_plumbing(ctx, placements, args)
    except Exception as failure:  # out of CUDA or shared memory, a size torch refuses (TypeError), ...: all end logged
        release_main_slots((), on_cuda)
        life.live.close(0)
        return close_job(job_dir, config, args, gpus, _setup_failed(failure, life.spool))
    supervisor = Supervisor(plumbing, life.spool, progress={name: Progress(w.progress) for name, w in wirings.items()})
    life.sampler.watch("main", os.getpid())
    life.watch_from_now()
    start = None
    with STOPS.reacting(lambda stop: plumbing.flag.take_over(stop.termination)):   # a stop raises the flag
        try:
            if spawned(ctx, supervisor, config, args, placements, wirings):
                for record in supervisor.book.records:
                    if record.pid is not None:  # every spawned child's record has one
                        life.sampler.watch(record.name, record.pid)
                life.sampler.start()  # from start-up on, so that model loading shows too
                start = _run_between_barriers(supervisor, life, len(placements))
        finally:
            end = plumbing.flag.raised_at if plumbing.flag.is_set else time.time()
            plumbing.flag.take_over(Termination.INTERRUPTED)  # a no-op unless we got here by an exception
            supervisor.stop(**_grace(plumbing.flag.reason, life.stall is not None))
            life.wind_down()
            held = with_main_memory(gpus, placements)
            left = release_main_slots(wirings.values(), on_cuda)
            ending = life.ending(supervisor.book, start, end, plumbing.flag.reason,
                                 counted=plumbing.finished_count if start is not None else None)
            result = close_job(job_dir, config, args, with_release(held, left, supervisor.book), ending)
    return result


def with_main_memory(gpus: Sequence[GpuRecord], placements: list[Placement]) -> list[GpuRecord]:
    """Each GPU's record with what the main process holds on it (`main_process`), None where it holds no slots.

    The main process allocates every CUDA slot, so it has a context on each
    GPU that holds one: beside the slots (its allocator's share), that context
    is memory the runners cannot use.  Taken while the slots still exist.
    """
    slots: dict[int, int] = {}
    for p in placements:
        device = torch.device(p.output_device)
        if p.output_shapes and device.type == "cuda":
            slots[device.index or 0] = slots.get(device.index or 0, 0) + slot_bytes(p) * p.num_slots
    records = []
    for gpu in gpus:
        if gpu.logical_index in slots:
            held = device_memory_record(gpu.uuid, os.getpid(), torch.cuda.memory_reserved(gpu.logical_index))
            gpu = dataclasses.replace(gpu, main_process=MainGpuMemory(
                held.device_process_bytes, held.device_outside_allocator_bytes, slots[gpu.logical_index]))
        records.append(gpu)
    return records


def release_main_slots(wirings: Iterable[LocalWiring], on_cuda: bool) -> dict[int, int]:
    """Once every child is gone: free the main process's slots, collect CUDA IPC, empty torch's cache.

    Every child released its hold on the CUDA slots it received
    (rnb.engines.local.shared_memory_transport.release_slots), so they can go now; a slot a
    killed child still held stays with torch's CUDA IPC until this process
    exits.  A process that runs several jobs (a bench, a test session) thus
    keeps no GPU memory from one job to the next.  Returns, per GPU index,
    what torch's allocator still reserves there afterwards (bytes); without
    CUDA slots (`on_cuda` false) CUDA is not touched at all.
    """
    for wiring in wirings:
        for slot in wiring.slots:
            slot.release()
    gc.collect()  # tensors of a job's slots that only reference cycles still hold (a failed setup's partial slots)
    if not on_cuda or not torch.cuda.is_initialized():
        return {}
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    return {index: torch.cuda.memory_reserved(index) for index in range(torch.cuda.device_count())}


def with_release(gpus: list[GpuRecord], left: Mapping[int, int], book: JobBook) -> list[GpuRecord]:
    """Each GPU's record with what stayed reserved after the release, and a note where slots could not be freed."""
    records = []
    for gpu in gpus:
        if gpu.main_process is not None:
            held = left.get(gpu.logical_index)
            gpu = dataclasses.replace(gpu, main_process=dataclasses.replace(gpu.main_process,
                                                                             left_after_release_bytes=held))
            if held:
                book.notes.append(f"GPU {gpu.logical_index}: {held / 2**20:.0f} MiB of CUDA slots stayed with the main "
                                  "process after the job: a runner that held them was killed before it could release "
                                  "them, so torch's CUDA IPC keeps them until this process exits")
        records.append(gpu)
    return records


def allocate_slots(ctx: BaseContext, placement: Placement) -> tuple[SharedSlot, ...]:
    if not placement.output_shapes:
        return ()
    device = torch.device(placement.output_device)
    return tuple(SharedSlot.allocate(ctx, placement.output_shapes, device, placement.output_dtypes)
                 for _ in range(placement.num_slots))


def build_plumbing(ctx: BaseContext, placements: list[Placement], args: RunArgs) -> tuple[Plumbing, dict[str, LocalWiring]]:
    """The queues, flag and start gate, and each runner's slots: its own and those of the producers it reads."""
    last = max(p.step for p in placements)
    queue_names = [set(q for p in placements if p.step == k for q in p.out_queues) for k in range(last)]
    plumbing = Plumbing.build(ctx, queue_names, args.queue_size, args.load.concurrency, args.request_queue_size,
                              completions=args.load.client == "loadgen")
    slots = {(p.step, p.group, p.instance): allocate_slots(ctx, p) for p in placements}
    wirings = {}
    for p in placements:
        sources = {(q.group, q.instance): slots[(q.step, q.group, q.instance)] for q in placements
                   if q.step == p.step - 1 and p.in_queue in q.out_queues}
        progress = ctx.RawArray("d", CELLS)
        progress[:] = empty_cells()
        wirings[p.name] = LocalWiring(slots[(p.step, p.group, p.instance)], sources, progress)
    return plumbing, wirings


def spawn_all(ctx: ForkServerContext, supervisor: Supervisor, config: PipelineConfig, args: RunArgs, placements: list[Placement],
              wirings: Mapping[str, LocalWiring]) -> None:
    """One client process, then one runner process per placement; none more once a stop came."""
    plumbing = supervisor.plumbing
    spec = ClientSpec(config.source, config.path, args.videos, args.load, args.seed, str(supervisor.spool.job_dir))
    supervisor.spawn(ctx, client_main, (spec, plumbing), ProcessRecord("client", "client"))
    for p in placements:
        if STOPS.received is not None:
            return
        arguments = (DeviceFirst(p.device), p, args.videos, wirings[p.name], plumbing)
        supervisor.spawn(ctx, runner_main, arguments, ProcessRecord(
            p.name, "runner", p.step, p.group, p.instance, p.device, threads=p.threads,
            output_device=p.output_device if p.output_shapes else None))


def spawned(ctx: ForkServerContext, supervisor: Supervisor, config: PipelineConfig, args: RunArgs,
            placements: list[Placement], wirings: Mapping[str, LocalWiring]) -> bool:
    """Spawn every child (spawn_all); False if a stop came first or cut the spawning short (the first child may wait
    seconds for the fork server's imports): then the children started are killed (none is ready, nothing is
    measured) and the fork server too, with any child it was forking when the stop came.

    The children start on a thread of their own (STOPS.cut_short): a stop
    that landed inside a child's start, between its connection to the fork
    server and the descriptors it sends, left the server reading nothing,
    and its traceback on the job's stderr.
    """
    if STOPS.cut_short(lambda: spawn_all(ctx, supervisor, config, args, placements, wirings), end_fork_server,
                       SPAWN_GRACE_S):
        return True
    supervisor.kill_all()
    end_fork_server()
    return False


def _run_between_barriers(supervisor: Supervisor, life: JobLife, runners: int) -> float | None:
    """Wait until every child is ready, open the start gate, then wait for the flag; the start time, if any.

    The main process raises the flag itself when the job's watch says it
    has stalled (first asking every child for its stacks; the stall is kept
    in `life`) or has run its maximum duration.  The live progress shows
    how far start-up and then the items have got.
    """
    if not _all_ready(supervisor, life):
        return None
    start = time.time()
    life.watch.started(start)
    supervisor.plumbing.open_start_gate()
    life.live.started()
    log.info("started %s: client and %d runners ready", life.job_dir.name, runners)
    _follow(supervisor, life)
    return start


def _all_ready(supervisor: Supervisor, life: JobLife) -> bool:
    """Wait until every child is ready (True) or the flag is raised first (False)."""
    plumbing = supervisor.plumbing
    while not plumbing.flag.is_set and len(supervisor.book.ready) < len(supervisor.children):
        supervisor.pump()
        life.live.starting(supervisor.book.ready)
        _stop_if_stalled(supervisor, life.watch.start_up(supervisor.book, supervisor.cpu_of_starting(), time.time()), life)
    return not plumbing.flag.is_set


def _follow(supervisor: Supervisor, life: JobLife) -> None:
    """Until the flag is raised: take in what the children report, show progress, end a job that stalled, ran its
    maximum duration or lost its log directory."""
    plumbing, watch = supervisor.plumbing, life.watch
    deadline = watch.deadline()
    while not plumbing.flag.is_set:
        # At the maximum duration's end the flag goes up within a few ms: its time is the job's end.
        supervisor.pump(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.time())))
        life.live.running(supervisor.spool.rows)
        now = time.time()
        if supervisor.spool.writes.first is not None:  # the log directory refused a write: nothing more to measure
            plumbing.flag.take_over(Termination.LOG_FAILED)
        elif watch.over_time(now):
            plumbing.flag.take_over(Termination.MAX_DURATION)
        else:
            _stop_if_stalled(supervisor, watch.running(supervisor.progress_now(), supervisor.demand_of_children,
                                                       supervisor.book, now, plumbing.queued(),
                                                       ClientCells(plumbing.client_cells).read()), life)


def _stop_if_stalled(supervisor: Supervisor, found: Stall | None, life: JobLife) -> None:
    """A stall ends the job: every child's stacks first (what each was doing, not how it left), then the flag,
    and the stalled child is killed."""
    if found is None or supervisor.plumbing.flag.is_set:
        return
    seen = time.time()   # the job's end: taking the stacks is part of stopping it, not of what it measured
    log.info("the job stalled: asking every process for its Python stacks")
    supervisor.ask_for_stacks()
    if supervisor.plumbing.flag.take_over(Termination.STALLED, seen):
        life.stall = found
        supervisor.book.first_failure(found.process, found.sentence)
        supervisor.kill(found.process)


def _grace(reason: Termination, stalled: bool) -> dict[str, float]:
    """How long the children may take to leave on their own (Supervisor.stop): a stalled job's not stuck leave within a
    poll; a stopped job's children still starting have nothing measured to flush, and are killed at once."""
    if stalled:
        return {"grace_s": STALLED_GRACE_S}
    return {"starting_grace_s": 0.0} if reason in (Termination.INTERRUPTED, Termination.TERMINATED) else {}


def _setup_failed(failure: Exception, spool: TimingsSpool) -> JobEnding:
    """A job that never spawned anything, and why in one sentence."""
    first_line = (str(failure).splitlines() or [""])[0]
    error = (f"could not set up the queues and shared tensors ({type(failure).__name__}: {first_line}); "
             "lower num_shared_tensors, the output shapes or -qs")
    return JobEnding(start=None, end=time.time(), reason=Termination.SETUP_FAILED, error=error, spool=spool,
                     book=JobBook())
