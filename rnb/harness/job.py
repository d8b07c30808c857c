"""One job of the local engine: spawn the client and the runners, time them, stop them, write the log.

    main process ── builds Plumbing (queues, flag, start gate) and every runner's SharedSlots
      │ spawns
    client ──requests──▶ step 0 runners ──signals──▶ step 1 runners ... ──▶ final step
                                                                             │ time cards
    main process ◀── status (ready / error / exit) from every child ◀────────┘ results

The start time is taken when every child has reported ready (the start
barrier), the end time when the termination flag is raised (the final step
counting the target, or a failure).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from rnb.analysis.summary import summary_text
from rnb.harness import client, joblog, runner
from rnb.harness.control import Plumbing, SharedSlot, Termination
from rnb.harness.sampler import DEFAULT_INTERVAL_MS, SampledGpu, Sampler
from rnb.harness.supervisor import Supervisor
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.plan import Placement

EXIT_CODES = {Termination.TARGET_REACHED: 0, Termination.INTERRUPTED: 130}


@dataclass(frozen=True)
class RunArgs:
    """The job's settings after command line, config "run" object and defaults are combined."""

    mean_interval_ms: float
    videos: int
    batch_size: int
    queue_size: int
    concurrency: int | None
    warmup: int
    seed: int
    cpu: bool
    log_dir: str
    sample_interval_ms: float = DEFAULT_INTERVAL_MS


def allocate_slots(ctx: Any, placement: Placement) -> tuple[SharedSlot, ...]:
    if not placement.output_shapes:
        return ()
    device = torch.device(placement.device)
    return tuple(SharedSlot.allocate(ctx, placement.output_shapes, device, placement.output_dtypes)
                 for _ in range(placement.num_slots))


def run_job(config: PipelineConfig, args: RunArgs, placements: list[Placement], gpus: list[dict]) -> int:
    """Spawn, start everyone together, wait for the flag, stop everyone, write the log."""
    ctx = mp.get_context("spawn")
    job = joblog.job_id(time.time(), args.mean_interval_ms, args.batch_size, args.videos, args.queue_size, args.concurrency)
    job_dir = joblog.create_job_dir(args.log_dir, job)
    joblog.write_json(job_dir / "config.json", config.raw)

    num_steps = len(config.steps)
    queue_names = [set(q for p in placements if p.step == k for q in p.out_queues) for k in range(num_steps - 1)]
    try:
        plumbing = Plumbing.build(ctx, queue_names, args.queue_size, args.concurrency)
        slots = {(p.step, p.group, p.instance): allocate_slots(ctx, p) for p in placements}
    except Exception as failure:  # out of CUDA or shared memory, a size torch refuses (TypeError), ...: all end logged
        return _setup_failed(job_dir, config, args, gpus, num_steps, failure)
    supervisor = Supervisor(plumbing)
    sampler = Sampler(args.sample_interval_ms / 1000.0,
                      tuple(SampledGpu(gpu["logical_index"], gpu["physical_index"]) for gpu in gpus))
    sampler.watch("main", os.getpid())
    previous_handler = signal.signal(signal.SIGINT, lambda *_: plumbing.flag.raise_(Termination.INTERRUPTED))
    start = None
    try:
        spec = client.ClientSpec(config.source, config.path, args.videos, args.mean_interval_ms, args.concurrency, args.seed)
        supervisor.spawn(ctx, client.main, (spec, plumbing), "client", "client")
        for p in placements:
            sources = {(q.group, q.instance): slots[(q.step, q.group, q.instance)] for q in placements
                       if q.step == p.step - 1 and p.in_queue in q.out_queues}
            spec = runner.RunnerSpec(p.name, p.step, p.group, p.instance, p.device, p.model, p.model_kwargs,
                                     p.selector, p.in_queue, p.out_queues, p.num_segments, args.videos,
                                     slots[(p.step, p.group, p.instance)], sources, p.selector_kwargs, p.threads)
            supervisor.spawn(ctx, runner.main, (spec, plumbing), p.name, "runner", p.step, p.group, p.instance, p.device)
            supervisor.children[-1].record["threads"] = p.threads
        for child in supervisor.children:
            sampler.watch(child.record["name"], child.record["pid"])
        sampler.start()  # from start-up on, so that model loading shows too
        while not plumbing.flag.is_set and len(supervisor.ready) < len(supervisor.children):
            supervisor.pump()
        if not plumbing.flag.is_set:
            start = time.time()
            plumbing.start.set()
            print(f"benchmark.py: started {job_dir.name}: client and {len(placements)} runners ready", file=sys.stderr, flush=True)
            with tqdm(total=args.videos, unit="item", file=sys.stderr, disable=None, leave=False) as bar:
                while not plumbing.flag.is_set:
                    supervisor.pump()
                    bar.update(len(supervisor.cards) - bar.n)
    finally:
        end = plumbing.flag.raised_at if plumbing.flag.is_set else time.time()
        plumbing.flag.raise_(Termination.INTERRUPTED)  # a no-op unless we got here by an exception
        supervisor.stop()
        sampler.stop()
        sampler.write(job_dir)
        signal.signal(signal.SIGINT, previous_handler)
        reason = plumbing.flag.reason
        error = _error_sentence(reason, supervisor, args)
        table = joblog.timings_table(supervisor.cards, num_steps, args.warmup)
        joblog.write_timings(job_dir, table)
        joblog.write_json(job_dir / "meta.json", joblog.meta_document(
            job=job_dir.name, config_path=config.path, args=dataclasses.asdict(args), start=start, end=end,
            finished=table.num_rows, reason=reason.reason,
            failed_process=supervisor.failure[0] if supervisor.failure else None, error=error,
            processes=[child.record for child in supervisor.children], gpus=gpus, num_steps=num_steps,
            notes=[*config.notes, *supervisor.notes]))
    if error:
        print(f"benchmark.py: {error}", file=sys.stderr)
    print(summary_text(table, num_steps, args.warmup, table.num_rows, None if start is None else end - start, reason.reason))
    print(f"job log: {job_dir}")
    return EXIT_CODES.get(reason, 1)


def _setup_failed(job_dir: Path, config: PipelineConfig, args: RunArgs, gpus: list[dict], num_steps: int,
                  failure: Exception) -> int:
    """Log a job that never spawned anything, and say why in one sentence."""
    first_line = (str(failure).splitlines() or [""])[0]
    error = (f"could not set up the queues and shared tensors ({type(failure).__name__}: {first_line}); "
             "lower num_shared_tensors, the output shapes or -qs")
    table = joblog.timings_table([], num_steps, args.warmup)
    joblog.write_timings(job_dir, table)
    joblog.write_json(job_dir / "meta.json", joblog.meta_document(
        job=job_dir.name, config_path=config.path, args=dataclasses.asdict(args), start=None, end=time.time(),
        finished=0, reason=Termination.SETUP_FAILED.reason, failed_process=None, error=error, processes=[],
        gpus=gpus, num_steps=num_steps, notes=list(config.notes)))
    print(f"benchmark.py: {error}", file=sys.stderr)
    print(f"job log: {job_dir}")
    return 1


def _error_sentence(reason: Termination, supervisor: Supervisor, args: RunArgs) -> str | None:
    if reason == Termination.PROCESS_FAILED and supervisor.failure:
        name, error = supervisor.failure
        return f"process {name} failed: {error}"
    if reason == Termination.REQUEST_QUEUE_FULL:
        return f"the request queue was full (capacity {args.queue_size}, -qs): the pipeline could not keep up with the requests"
    if reason == Termination.INTER_STEP_QUEUE_FULL:
        return f"an inter-step queue was full (capacity {args.queue_size}, -qs): a step could not keep up with the one before it"
    return None
