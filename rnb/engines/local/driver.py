"""The local engine's driver: one job on this host, who spawns whom, and what flows where.

    main process (run_job) ── builds Plumbing (queues, flag, start gate) and every runner's SharedSlots
      │ spawns (rnb.engines.local.transport: client_main, runner_main)
      ▼
    client ──Request──▶ step 0 runners ──Signal──▶ step 1 runners ... ──▶ final step
     (rnb.engines.client)  (rnb.engines.runner, the same loop at every step)        │
                                                                                   │ Results
    main process ◀── Ready, Failed, Exited from every child ◀──────────────────────┘

The start time is taken when every child has reported ready (the start
barrier), the end time when the termination flag is raised (the final step
counting the target, or a failure).  The job's log is opened and closed by
the engine-neutral ends in rnb.engines.job.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from rnb.core.records import ProcessRecord
from rnb.core.termination import Termination
from rnb.engines.client import ClientSpec
from rnb.engines.job import STOP_SIGNALS, JobBook, JobEnding, JobResult, RunArgs, close_job, error_sentence, open_job_dir
from rnb.engines.local.plumbing import Plumbing, SharedSlot
from rnb.engines.local.supervisor import Supervisor
from rnb.engines.local.transport import DeviceFirst, LocalWiring, client_main, runner_main
from rnb.engines.sampler import SampledGpu, Sampler
from rnb.engines.spool import TimingsSpool
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.gpus import device_memory_record
from rnb.pipeline.plan import Placement

log = logging.getLogger(__name__)


def run_job(config: PipelineConfig, args: RunArgs, placements: list[Placement], gpus: list[dict]) -> JobResult:
    """Spawn, start everyone together, wait for the flag, stop everyone, write the log."""
    ctx = mp.get_context("spawn")
    job_dir = open_job_dir(config, args)
    spool = TimingsSpool(job_dir, len(config.steps), args.warmup)
    try:
        plumbing, wirings = build_plumbing(ctx, placements, args)
    except Exception as failure:  # out of CUDA or shared memory, a size torch refuses (TypeError), ...: all end logged
        return close_job(job_dir, config, args, gpus, _setup_failed(failure, spool))
    supervisor = Supervisor(plumbing, spool)
    sampler = Sampler(args.sample_interval_ms / 1000.0,
                      tuple(SampledGpu(gpu["logical_index"], gpu["physical_index"]) for gpu in gpus))
    sampler.watch("main", os.getpid())
    previous = {number: signal.signal(number, lambda number, _: plumbing.flag.take_over(STOP_SIGNALS[number]))
                for number in STOP_SIGNALS}
    start = None
    try:
        spawn_all(ctx, supervisor, config, args, placements, wirings)
        for record in supervisor.book.records:
            sampler.watch(record.name, record.pid)
        sampler.start()  # from start-up on, so that model loading shows too
        start = _run_between_barriers(supervisor, job_dir.name, args.videos, len(placements))
    finally:
        end = plumbing.flag.raised_at if plumbing.flag.is_set else time.time()
        plumbing.flag.take_over(Termination.INTERRUPTED)  # a no-op unless we got here by an exception
        supervisor.stop()
        sampler.stop()
        sampler.write(job_dir)
        for number, handler in previous.items():
            signal.signal(number, handler)
        reason = plumbing.flag.reason
        result = close_job(job_dir, config, args, with_main_memory(gpus, placements), JobEnding(
            start=start, end=end, reason=reason, error=error_sentence(reason, supervisor.book.failure, args),
            spool=spool, book=supervisor.book))
    return result


def with_main_memory(gpus: list[dict], placements: list[Placement]) -> list[dict]:
    """Each GPU's record with what the main process holds on it (`main_process`), None where it holds no slots.

    The main process allocates every CUDA slot, so it has a context on each
    GPU that holds one: beside the slots (its allocator's share), that context
    is memory the runners cannot use.
    """
    held = {torch.device(p.output_device).index for p in placements
            if p.output_shapes and torch.device(p.output_device).type == "cuda"}
    return [{**gpu, "main_process": device_memory_record(gpu["uuid"], os.getpid(),
                                                         torch.cuda.memory_reserved(gpu["logical_index"]))
             if gpu["logical_index"] in held else None} for gpu in gpus]


def allocate_slots(ctx: Any, placement: Placement) -> tuple[SharedSlot, ...]:
    if not placement.output_shapes:
        return ()
    device = torch.device(placement.output_device)
    return tuple(SharedSlot.allocate(ctx, placement.output_shapes, device, placement.output_dtypes)
                 for _ in range(placement.num_slots))


def build_plumbing(ctx: Any, placements: list[Placement], args: RunArgs) -> tuple[Plumbing, dict[str, LocalWiring]]:
    """The queues, flag and start gate, and each runner's slots: its own and those of the producers it reads."""
    last = max(p.step for p in placements)
    queue_names = [set(q for p in placements if p.step == k for q in p.out_queues) for k in range(last)]
    plumbing = Plumbing.build(ctx, queue_names, args.queue_size, args.concurrency, args.request_queue_size)
    slots = {(p.step, p.group, p.instance): allocate_slots(ctx, p) for p in placements}
    wirings = {}
    for p in placements:
        sources = {(q.group, q.instance): slots[(q.step, q.group, q.instance)] for q in placements
                   if q.step == p.step - 1 and p.in_queue in q.out_queues}
        wirings[p.name] = LocalWiring(slots[(p.step, p.group, p.instance)], sources)
    return plumbing, wirings


def spawn_all(ctx: Any, supervisor: Supervisor, config: PipelineConfig, args: RunArgs, placements: list[Placement],
              wirings: Mapping[str, LocalWiring]) -> None:
    """One client process, then one runner process per placement."""
    plumbing = supervisor.plumbing
    spec = ClientSpec(config.source, config.path, args.videos, args.mean_interval_ms, args.concurrency, args.seed)
    supervisor.spawn(ctx, client_main, (spec, plumbing), ProcessRecord("client", "client"))
    for p in placements:
        arguments = (DeviceFirst(p.device), p, args.videos, wirings[p.name], plumbing)
        supervisor.spawn(ctx, runner_main, arguments, ProcessRecord(
            p.name, "runner", p.step, p.group, p.instance, p.device, threads=p.threads))


def _run_between_barriers(supervisor: Supervisor, job: str, videos: int, runners: int) -> float | None:
    """Wait until every child is ready, open the start gate, then wait for the flag; the start time, if any."""
    plumbing = supervisor.plumbing
    while not plumbing.flag.is_set and len(supervisor.book.ready) < len(supervisor.children):
        supervisor.pump()
    if plumbing.flag.is_set:
        return None
    start = time.time()
    plumbing.open_start_gate()
    log.info("started %s: client and %d runners ready", job, runners)
    with tqdm(total=videos, unit="item", file=sys.stderr, disable=None, leave=False) as bar:
        while not plumbing.flag.is_set:
            supervisor.pump()
            bar.update(supervisor.spool.rows - bar.n)
    return start


def _setup_failed(failure: Exception, spool: TimingsSpool) -> JobEnding:
    """A job that never spawned anything, and why in one sentence."""
    first_line = (str(failure).splitlines() or [""])[0]
    error = (f"could not set up the queues and shared tensors ({type(failure).__name__}: {first_line}); "
             "lower num_shared_tensors, the output shapes or -qs")
    return JobEnding(start=None, end=time.time(), reason=Termination.SETUP_FAILED, error=error, spool=spool,
                     book=JobBook())
