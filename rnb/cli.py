"""The benchmark's command line: parse, validate config and GPUs, plan, then run the job.

    python benchmark.py -c config/toy.json -mi 3 -v 2000      (or: rnb-benchmark ...)

Exit codes: 0 target reached or maximum duration run, 1 failed job (a
process failed, a queue was full, the job stalled, its log could not be
written, or the queues and shared tensors could not be set up), 2 invalid
config, arguments or GPU request, 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM).

CUDA_DEVICE_ORDER is set to PCI_BUS_ID (unless the environment already sets
it) before anything touches CUDA, so CUDA numbers GPUs as NVML does and the
GPU checked free by rnb.pipeline.gpus is the GPU the runner then uses; torch's
UUID of every GPU asked for is then checked against NVML's (exit 2 if they
differ), and each runner checks its own again at start.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rnb.flags as flags
from rnb.analysis.summary import job_summary, judged
from rnb.console import terminal_logging
from rnb.core import joblog
from rnb.engines.drivers import EngineJob, driver_of
from rnb.engines.job import JobResult, RunArgs, request_queue_note
from rnb.engines.loadgen import loadgen_refusal
from rnb.engines.registry import ENGINES, EngineUnavailable, engine_named
from rnb.engines.sampler import DEFAULT_INTERVAL_MS
from rnb.engines.stopping import STOPS
from rnb.load import DEFAULTS as LOAD_DEFAULTS
from rnb.load import EXCLUSIVE, LOAD_KEYS, SCENARIO_KEYS, LoadSettings, mode_of, with_scenario
from rnb.load import refusal as load_refusal
from rnb.pipeline.config import ConfigError, PipelineConfig, load_config
from rnb.pipeline.dataset_source import with_dataset
from rnb.pipeline.gpus import (
    DEVICE_ORDER,
    apply_cpu_override,
    busy_notes,
    check_cuda_numbering,
    validate_gpus,
)
from rnb.pipeline.plan import check_against_dataset, check_slot_memory, limit_replicas, plan_runners
from rnb.pipeline.run_keys import RUN_DEFAULTS, RUN_KEYS
from rnb.pipeline.sources import check_source

# The load keys that choose a mode: one of them on the command line replaces the config's load mode.
MODE_CHOOSERS: tuple[str, ...] = (*EXCLUSIVE, "mean_interval_ms", "scenario")
SCENARIO_SETTINGS = {key.name for key in SCENARIO_KEYS} - {"scenario"}

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return benchmark_parser().parse_args(argv)


def benchmark_parser() -> flags.CommandParser:
    """benchmark.py's flags: RnB's, the load modes' (rnb.load) and the harness's own."""
    parser = flags.CommandParser("benchmark.py", "Benchmark a multi-step, multi-process video inference pipeline.")
    parser.add_argument(*flags.CONFIG, dest="config_file_path",
                        help="pipeline config JSON (default: the embedded default config, rnb/pipeline/default.json, "
                             "which config/default.json links to)")
    # The keys a config's "run" object may also set: each flag's range, spellings and help declared once
    # (rnb.load's keys, rnb.pipeline.run_keys).
    defaults = {**LOAD_DEFAULTS, **RUN_DEFAULTS}
    for key in (*LOAD_KEYS.values(), *RUN_KEYS.values()):
        parser.add_argument(*key.spellings, dest=key.name, metavar=key.metavar, type=key.parse,
                            help=key.flag_help(defaults[key.name]))
    parser.add_argument(*flags.QUIET, action="store_true",
                        help="no live progress on stderr (default: a bar on a terminal, else a progress: line every 5 s)")
    parser.add_argument("--check", action="store_true", help="verify imports, environment and config, then exit")
    parser.add_argument("--cpu", action="store_true", help="run every runner on the CPU whatever the config's gpus say")
    parser.add_argument("--log-dir", dest="log_dir", default="logs", help="where job logs go (default logs/)")
    parser.add_argument("--sample-interval-ms", dest="sample_interval_ms", type=flags.number(0, above=True),
                        default=DEFAULT_INTERVAL_MS, metavar="MS",
                        help="how often CPU, memory and GPU use are sampled into samples.parquet "
                             f"(default {DEFAULT_INTERVAL_MS:g})")
    parser.add_argument("--dataset", help="replace the root (or video glob) of the config's dataset or videos source "
                                          "(default: the config's)")
    parser.add_argument("--allow-busy-gpus", dest="allow_busy_gpus", action="store_true",
                        help="run on GPUs that other processes use (said in the job log) instead of refusing")
    parser.add_argument("--max-replicas", dest="max_replicas", type=flags.integer(1), metavar="N",
                        help="at most N runners per queue group (the first N of its gpus), to try a many-GPU config "
                             "(default: all)")
    parser.add_argument("--ray-address", dest="ray_address",
                        help="the Ray cluster to run on (default: RAY_ADDRESS if set, else a Ray started for the job)")
    return parser


def resolve_args(ns: argparse.Namespace, config: PipelineConfig) -> RunArgs:
    """Command line over config "run" over DEFAULTS (parse_args checked each flag's range); a bad mix raises ConfigError."""
    values = _combined(ns, config, RUN_DEFAULTS)
    load = _checked_load(ns, config, values["videos"])
    if load.scenario is not None and ns.warmup is None and "warmup" not in config.run:
        values["warmup"] = 0   # LoadGen counts every query of a scenario's run
    _check_warmup(ns, config, values["warmup"], values["videos"])
    engine = values["engine"]   # the run key's check named a registered engine
    if load.client == "loadgen":
        _check_loadgen(ns, config, engine, values["max_duration_s"])
    if ns.ray_address is not None and not engine_named(engine).takes_address:
        raise ConfigError(flags.WHERE, "--ray-address", _address_refusal(engine))
    return RunArgs(**values, load=load, cpu=ns.cpu, log_dir=ns.log_dir, sample_interval_ms=ns.sample_interval_ms,
                   ray_address=ns.ray_address, quiet=ns.quiet)


def _address_refusal(engine: str) -> str:
    """Why --ray-address does not go with `engine`: the engines that run on a cluster it names."""
    takers = [name for name, declared in ENGINES.items() if declared.takes_address]
    asked = " or ".join(f'--engine {name} or the config\'s "run": {{"engine": "{name}"}}' for name in takers)
    return f"expected the {' or '.join(takers)} engine ({asked}), found the {engine} engine"


def _checked_load(ns: argparse.Namespace, config: PipelineConfig, videos: int) -> LoadSettings:
    """The job's load settings; ConfigError naming the flag, or the config's run key, that makes a bad mix."""
    run = _standing_run_load(ns, config)
    given = [key for key in LOAD_KEYS if getattr(ns, key) is not None or key in run]
    values: dict[str, Any] = {key: getattr(ns, key) if getattr(ns, key) is not None else run.get(key, default)
                              for key, default in LOAD_DEFAULTS.items()}
    load = with_scenario(LoadSettings(**values), given)
    problem = load_refusal(load, given, videos)
    if problem is None:
        return load
    key, expected = problem
    if getattr(ns, key) is not None:
        raise ConfigError(flags.WHERE, flags.flag_name(LOAD_KEYS[key].spellings), expected)
    raise ConfigError(config.path, f"run.{key}", expected)


def _check_loadgen(ns: argparse.Namespace, config: PipelineConfig, engine: str, max_duration_s: float) -> None:
    """Refuse --client loadgen (or run.client) where LoadGen cannot drive the job: not installed, Ray, a maximum duration."""
    problem = loadgen_refusal(engine, max_duration_s)
    if problem is not None:
        raise ConfigError(*((flags.WHERE, "--client") if ns.client is not None else (config.path, "run.client")), problem)


def _standing_run_load(ns: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    """The config's load keys that the command line leaves standing: all of them, unless a flag chooses a load
    mode; then only that mode's keys (the config's run.fps stands beside --streams, its run.streams not beside
    --arrivals): a flag's load mode replaces the config's."""
    run = {key: value for key, value in config.run.items() if key in LOAD_KEYS}
    flagged = {key: getattr(ns, key) for key in LOAD_KEYS if getattr(ns, key) is not None}
    if not any(key in flagged for key in MODE_CHOOSERS):
        return run
    values: dict[str, Any] = {**LOAD_DEFAULTS, **flagged}
    mode = mode_of(with_scenario(LoadSettings(**values), flagged))
    # A scenario's own settings (its query size, target, minimum duration, client) stand beside a flagged scenario.
    kept = {declared.name for declared in mode.keys} | (SCENARIO_SETTINGS if "scenario" in flagged else set())
    return {key: value for key, value in run.items() if key in kept}


def _combined(ns: argparse.Namespace, config: PipelineConfig, defaults: Mapping[str, object]) -> dict[str, Any]:
    return {key: getattr(ns, key) if getattr(ns, key) is not None else config.run.get(key, default)
            for key, default in defaults.items()}


def _check_warmup(ns: argparse.Namespace, config: PipelineConfig, warmup: int, videos: int) -> None:
    """Refuse a warm-up that leaves no item to measure where it was asked for: --warmup, or a config whose run
    gives both.

    A -v below a warm-up the user did not set (the built-in one, a shipped config's run.warmup) still runs:
    a smoke run such as -v 4 is not a mistake, and its summary says that no item was measured.
    """
    if warmup < videos:
        return
    if ns.warmup is not None:
        raise ConfigError(flags.WHERE, "--warmup", f"expected fewer warm-up items than the {videos} requests to "
                                                      f"finish (-v), found {warmup}, which would leave none to measure")
    if ns.videos is None and "warmup" in config.run and "videos" in config.run:
        raise ConfigError(config.path, "run.warmup", f"expected fewer warm-up items than the {videos} requests to "
                                                     f"finish (run.videos), found {warmup}, which would leave none to "
                                                     "measure")


def prepare_log_dir(log_dir: str) -> None:
    """Create the log directory before anything starts, so a bad --log-dir costs one sentence and exit 2."""
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError("command line", "--log-dir", f"expected a directory for the job logs, found a file at {log_dir}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError("command line", "--log-dir", f"expected a directory that exists or can be created, "
                          f"found that {error.filename} cannot be created ({error.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("command line", "--log-dir", f"expected a directory this user may write, found {log_dir} read-only")


def main(argv: list[str] | None = None) -> int:
    """The whole command: its exit code (0 done, 1 failed job, 2 invalid request, 130 interrupted, 143 terminated).

    A stop before the job's log exists raises rnb.engines.stopping.Stopped
    where the command's handlers are installed (rnb.launch prints it).
    """
    for key, value in DEVICE_ORDER.items():
        os.environ.setdefault(key, value)
    try:
        ns = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    with terminal_logging("benchmark.py"):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    try:
        config = load_config(ns.config_file_path)
        if ns.dataset is not None:
            config = with_dataset(config, ns.dataset)
        if ns.max_replicas is not None:
            config = limit_replicas(config, ns.max_replicas)
        args = resolve_args(ns, config)
        config = dataclasses.replace(config, notes=(*config.notes, *filter(None, [request_queue_note(args)])))
        # An engine whose GPUs are its nodes' (Ray) checks each on its node, in its driver.
        engine = engine_named(args.engine)
        gpus = validate_gpus(config, cpu_only=args.cpu or not engine.gpus_checked_here, allow_busy=ns.allow_busy_gpus)
        check_cuda_numbering(config, gpus)
        config = dataclasses.replace(config, notes=(*config.notes, *busy_notes(gpus)))
        dataset = _checked_source(config, ns)
        placements = plan_runners(apply_cpu_override(config) if args.cpu else config, args.batch_size)
        check_against_dataset(config, placements, dataset)
        check_slot_memory(config, placements, {gpu.logical_index: gpu.memory_total_bytes for gpu in gpus})
        if not ns.check:
            prepare_log_dir(args.log_dir)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    for note in config.notes:
        print(f"benchmark.py: {note}", file=sys.stderr)
    if ns.check:
        versions = ", ".join(f"{name} {version}" for name, version in joblog.versions().items())
        print(f"ready: {versions}; {config.path} is valid ({len(config.steps)} steps, {len(placements)} runners)")
        return 0
    try:
        result = driver_of(engine)(EngineJob(config, args, placements, gpus, ns.allow_busy_gpus))
    except ConfigError as error:   # what the engine's hosts cannot run, found before any log exists
        print(error, file=sys.stderr)
        return 2
    except (EngineUnavailable, joblog.LogWriteError) as error:  # hosts out of reach; a log directory that refused the job
        print(f"benchmark.py: {error}", file=sys.stderr)
        return 1
    return _reported(result)


def _checked_source(config: PipelineConfig, ns: argparse.Namespace) -> object:
    """check_source, blaming --dataset, not the config, for a root or glob the command line gave."""
    try:
        return check_source(config.source, config.path, may_write=not ns.check)
    except ConfigError as error:
        if ns.dataset is not None and error.json_path == f"source.{next(iter(config.source), '')}":
            raise ConfigError("command line", "--dataset", error.expected) from None
        raise


def _reported(result: JobResult) -> int:
    """Print the end-of-run summary of the job just logged; its exit code.

    The summary reads the log back, so what is printed and what is analysed
    later cannot disagree; it is part of the run, so main's peak memory is
    recorded in meta.json after it.  A log the log directory refused has
    no summary (its error said what is missing).
    """
    stop = STOPS.received
    if stop is not None and result.exit_code == stop.exit_code:
        print(f"benchmark.py: {stop.sentence('after its log was opened: the log keeps what it measured')}",
              file=sys.stderr)
    if result.logged and (result.job_dir / joblog.TIMINGS_FILE).exists():
        window = judged(result.job_dir)
        print(job_summary(result.job_dir, window))
        try:
            joblog.record_after_summary(result.job_dir, None if window.scenario is None else window.scenario.to_json())
        except OSError:
            pass  # meta.json stands as written, with the peak before the summary
    print(f"job log: {result.job_dir}{'' if result.logged else ' (incomplete: no meta.json)'}")
    return result.exit_code
