"""RnB's entry point: validate, spawn the client and runners, time the job, write its log.

    python benchmark.py -c config/toy.json -mi 3 -v 2000

Exit codes: 0 target reached, 1 failed job (a process failed, a queue was
full, or the queues and shared tensors could not be set up), 2 invalid config,
arguments or GPU request, 130 interrupted.

CUDA_DEVICE_ORDER is set to PCI_BUS_ID (unless the environment already sets
it) before anything touches CUDA, so CUDA numbers GPUs as NVML does and the
GPU checked free by rnb.gpus is the GPU the runner then uses.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.multiprocessing as mp
from tqdm import tqdm

import client
import runner
from control import Plumbing, SharedSlot, Termination
from rnb import joblog
from rnb.config import RUN_KEYS, ConfigError, PipelineConfig, load_config
from rnb.dataset_source import with_dataset
from rnb.gpus import apply_cpu_override, validate_gpus
from rnb.plan import Placement, plan_runners
from rnb.sources import check_source
from rnb.summary import summary_text
from rnb.supervisor import Supervisor

# What applies when neither the command line nor the config's "run" object sets a value.
DEFAULTS: dict[str, Any] = {"mean_interval_ms": 3, "videos": 2000, "batch_size": 1, "queue_size": 50000,
                            "concurrency": None, "warmup": 10, "seed": 0}
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One sentence, not a usage dump: the flags are in --help.
        self.exit(2, f"{self.prog}: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="benchmark.py", description="Benchmark a multi-step, multi-process video inference pipeline.")
    parser.add_argument("-c", "--config_file_path", help="pipeline config JSON (default: the embedded default config)")
    parser.add_argument("-mi", "--mean_interval_ms", type=float, help="Poisson mean inter-arrival in ms; 0 = bulk (default 3)")
    parser.add_argument("-v", "--videos", type=int, help="number of requests to finish (default 2000)")
    parser.add_argument("-b", "--batch_size", type=int, help="default batch of batching steps (default 1)")
    parser.add_argument("-qs", "--queue_size", type=int, help="capacity of every queue (default 50000)")
    parser.add_argument("--check", action="store_true", help="verify imports, environment and config, then exit")
    parser.add_argument("--cpu", action="store_true", help="run every runner on the CPU whatever the config's gpus say")
    parser.add_argument("--concurrency", type=int, help="closed loop: keep N requests in flight (-mi is then ignored)")
    parser.add_argument("--warmup", type=int, help="first N items excluded from latency statistics (default 10)")
    parser.add_argument("--log-dir", dest="log_dir", default="logs", help="where job logs go (default logs/)")
    parser.add_argument("--seed", type=int, help="seed of the Poisson arrivals and of a random episode order (default 0)")
    parser.add_argument("--dataset", help="replace the root (or video glob) of the config's dataset or videos source")
    return parser.parse_args(argv)


def resolve_args(ns: argparse.Namespace, config: PipelineConfig) -> RunArgs:
    """Command line over config "run" over DEFAULTS; a bad command-line value raises ConfigError."""
    values = {}
    flags = {"mean_interval_ms": "-mi/--mean_interval_ms", "videos": "-v/--videos", "batch_size": "-b/--batch_size",
             "queue_size": "-qs/--queue_size", "concurrency": "--concurrency", "warmup": "--warmup", "seed": "--seed"}
    for key, default in DEFAULTS.items():
        given = getattr(ns, key)
        _, minimum, maximum = RUN_KEYS[key]
        if given is not None and (not math.isfinite(given) or given < minimum):
            raise ConfigError("command line", flags[key], f"expected a number >= {minimum}, found {given:g}")
        if given is not None and maximum is not None and given > maximum:
            raise ConfigError("command line", flags[key], f"expected at most {maximum}, found {given}")
        values[key] = given if given is not None else config.run.get(key, default)
    return RunArgs(**values, cpu=ns.cpu, log_dir=ns.log_dir)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        ns = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        config = load_config(ns.config_file_path)
        if ns.dataset is not None:
            config = with_dataset(config, ns.dataset)
        args = resolve_args(ns, config)
        gpus = validate_gpus(config, cpu_only=args.cpu)
        check_source(config.source, config.path)
        placements = plan_runners(apply_cpu_override(config) if args.cpu else config, args.batch_size)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    if ns.check:
        versions = ", ".join(f"{name} {version}" for name, version in joblog.versions().items())
        print(f"ready: {versions}; {config.path} is valid ({len(config.steps)} steps, {len(placements)} runners)")
        return 0
    return run_job(config, args, placements, [dataclasses.asdict(gpu) for gpu in gpus])


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
    except (RuntimeError, OSError) as failure:  # e.g. CUDA or shared memory out of memory
        return _setup_failed(job_dir, config, args, gpus, num_steps, failure)
    supervisor = Supervisor(plumbing)
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
            notes=supervisor.notes))
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
        gpus=gpus, num_steps=num_steps, notes=[]))
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


if __name__ == "__main__":
    sys.exit(main())
