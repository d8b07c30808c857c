"""One job: who spawns whom, and what flows where.

    main process (run_job) ── builds Plumbing (queues, flag, start gate) and every runner's SharedSlots
      │ spawns (rnb.harness.local: client_main, runner_main)
      ▼
    client ──Request──▶ step 0 runners ──Signal──▶ step 1 runners ... ──▶ final step
     (rnb.harness.client)   (rnb.harness.runner, the same loop at every step)      │
                                                                                   │ Results
    main process ◀── Ready, Failed, Exited from every child ◀──────────────────────┘

The start time is taken when every child has reported ready (the start
barrier), the end time when the termination flag is raised (the final step
counting the target, or a failure).  `open_job_dir` and `close_job` are the
engine-independent ends of a job: the log directory, the log and the summary.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from rnb.analysis.summary import summary_text, utilisation_text
from rnb.harness import joblog
from rnb.harness.client import ClientSpec
from rnb.harness.control import Plumbing, SharedSlot, Termination
from rnb.harness.local import DeviceFirst, LocalWiring, client_main, runner_main
from rnb.harness.runner import RunnerSpec
from rnb.harness.sampler import DEFAULT_INTERVAL_MS, SampledGpu, Sampler
from rnb.harness.spool import TimingsSpool
from rnb.harness.supervisor import Supervisor
from rnb.pipeline.config import MAX_SEMAPHORE_VALUE, PipelineConfig
from rnb.pipeline.gpus import device_memory_record
from rnb.pipeline.plan import Placement

log = logging.getLogger(__name__)

EXIT_CODES = {Termination.TARGET_REACHED: 0, Termination.INTERRUPTED: 130, Termination.TERMINATED: 143}
# What stops a job from outside: Ctrl-C, and SIGTERM (kill, schedulers, containers); children ignore both.
STOP_SIGNALS = {signal.SIGINT: Termination.INTERRUPTED, signal.SIGTERM: Termination.TERMINATED}


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
    engine: str = "local"             # "local" (spawned processes) or "ray" (rnb.harness.ray_engine)
    ray_address: str | None = None    # --ray-address as given
    request_queue_size: int = field(init=False)  # -qs, or in bulk mode at least -v (see __post_init__)

    def __post_init__(self) -> None:
        # Bulk mode sends every request at once, so the request queue must hold all -v of them whatever -qs
        # says, as RnB sized it; -qs still bounds the inter-step queues.
        bulk = self.mean_interval_ms == 0 and self.concurrency is None
        size = min(max(self.queue_size, self.videos), MAX_SEMAPHORE_VALUE) if bulk else self.queue_size
        object.__setattr__(self, "request_queue_size", size)


def request_queue_note(args: RunArgs) -> str | None:
    """The job-log note of a request queue that bulk mode made larger than -qs."""
    if args.request_queue_size == args.queue_size:
        return None
    return (f"bulk mode (-mi 0): the request queue holds all {args.request_queue_size} requests, more than "
            f"-qs {args.queue_size} (which still bounds the inter-step queues), as RnB sized it")


@dataclass(frozen=True)
class JobEnding:
    """How a job ended, as its log records it, whatever the engine."""

    start: float | None               # the start barrier passed; None if it never did
    end: float
    reason: Termination
    error: str | None                 # one sentence, for the user and meta.json
    failed_process: str | None
    spool: TimingsSpool               # finished items, streamed to disk as they came
    processes: list[dict[str, Any]]   # meta.json `processes`
    notes: list[str]                  # what the processes said (the config's own notes are added to them)
    engine: Mapping[str, Any] = field(default_factory=lambda: {"name": "local"})  # meta.json's `engine`


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    job_dir: Path
    summary: str                      # the human-readable end-of-run summary


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
        for child in supervisor.children:
            sampler.watch(child.record["name"], child.record["pid"])
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
            start=start, end=end, reason=reason, error=error_sentence(reason, supervisor.failure, args),
            failed_process=supervisor.failure[0] if supervisor.failure else None, spool=spool,
            processes=[child.record for child in supervisor.children], notes=supervisor.notes))
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
    supervisor.spawn(ctx, client_main, (spec, plumbing), "client", "client")
    for p in placements:
        spec = RunnerSpec.from_placement(p, target=args.videos)
        arguments = (DeviceFirst(p.device), spec, wirings[p.name], plumbing)
        supervisor.spawn(ctx, runner_main, arguments, p.name, "runner", p.step, p.group, p.instance, p.device)
        supervisor.children[-1].record["threads"] = p.threads


def _run_between_barriers(supervisor: Supervisor, job: str, videos: int, runners: int) -> float | None:
    """Wait until every child is ready, open the start gate, then wait for the flag; the start time, if any."""
    plumbing = supervisor.plumbing
    while not plumbing.flag.is_set and len(supervisor.ready) < len(supervisor.children):
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


def open_job_dir(config: PipelineConfig, args: RunArgs) -> Path:
    """The job's new log directory, holding a copy of its config."""
    job = joblog.job_id(time.time(), args.mean_interval_ms, args.batch_size, args.videos, args.queue_size, args.concurrency)
    job_dir = joblog.create_job_dir(args.log_dir, job)
    joblog.write_json(job_dir / "config.json", config.raw)
    return job_dir


def close_job(job_dir: Path, config: PipelineConfig, args: RunArgs, gpus: list[dict], ending: JobEnding) -> JobResult:
    """Write timings.parquet and meta.json, report the error if any, and summarise the job.

    meta.json is written before the summary, so that a summary that fails
    loses nothing measured, and again after it with main's peak RSS then:
    the summary is part of the run, and its memory counts.
    """
    num_steps = len(config.steps)
    timings = ending.spool.close()
    meta = joblog.meta_document(
        job=job_dir.name, config_path=config.path, args=dataclasses.asdict(args), start=ending.start,
        end=ending.end, finished=ending.spool.rows, reason=ending.reason.reason, failed_process=ending.failed_process,
        error=ending.error, processes=ending.processes, gpus=gpus, num_steps=num_steps,
        notes=[*config.notes, *ending.notes], engine=ending.engine)
    joblog.write_json(job_dir / "meta.json", meta)
    if ending.error:
        log.error("%s", ending.error)
    elapsed = None if ending.start is None else ending.end - ending.start
    summary = summary_text(timings, num_steps, args.warmup, ending.spool.rows, elapsed, ending.reason.reason)
    summary = "\n".join(filter(None, (summary, utilisation_text(job_dir))))
    joblog.write_json(job_dir / "meta.json", {**meta, "main_peak_rss_bytes": joblog.main_peak_rss_bytes()})
    return JobResult(EXIT_CODES.get(ending.reason, 1), job_dir, summary)


def _setup_failed(failure: Exception, spool: TimingsSpool) -> JobEnding:
    """A job that never spawned anything, and why in one sentence."""
    first_line = (str(failure).splitlines() or [""])[0]
    error = (f"could not set up the queues and shared tensors ({type(failure).__name__}: {first_line}); "
             "lower num_shared_tensors, the output shapes or -qs")
    return JobEnding(start=None, end=time.time(), reason=Termination.SETUP_FAILED, error=error, failed_process=None,
                     spool=spool, processes=[], notes=[])


def error_sentence(reason: Termination, failure: tuple[str, str] | None, args: RunArgs) -> str | None:
    if reason == Termination.PROCESS_FAILED and failure:
        name, error = failure
        return f"process {name} failed: {error}"
    if reason == Termination.REQUEST_QUEUE_FULL:
        return (f"the request queue was full (capacity {args.request_queue_size}, -qs): the pipeline could not keep up "
                "with the requests")
    if reason == Termination.INTER_STEP_QUEUE_FULL:
        return f"an inter-step queue was full (capacity {args.queue_size}, -qs): a step could not keep up with the one before it"
    return None
