"""rnb-tune's flags, by what each group of them decides, and the flags refused together."""
from __future__ import annotations

import argparse
from pathlib import Path

import rnb.flags as flags
from rnb.analysis.rnb_sweep import add_job_rules
from rnb.engines.registry import DEFAULT_ENGINE, ENGINES, engines_help
from rnb.tune.sim_records import DEFAULT_ITEMS
from rnb.tune.streams import DEFAULT_BOUND


def add_flags(parser: flags.CommandParser) -> None:
    """Every flag of rnb-tune, in the order its --help lists them."""
    add_budget_flags(parser)
    add_goal_flags(parser)
    add_search_flags(parser)
    add_verify_flags(parser)


def add_budget_flags(parser: flags.CommandParser) -> None:
    """The config and what its replicas may use."""
    parser.add_argument(*flags.CONFIG, dest="config", required=True, help="the tuning config: a pipeline config, where a "
                        "Batcher's batch or a step's num_segments may be a list of choices (required)")
    parser.add_argument("--gpus", type=flags.integers(0), metavar="LIST",
                        help="GPUs the replicas may use, e.g. 0,1,2,3; several replicas may share one (default: none)")
    parser.add_argument("--cpu-slots", type=flags.integer(0), default=0, metavar="N",
                        help="replica slots on the CPU, one per replica of a work step (default 0)")


def add_goal_flags(parser: flags.CommandParser) -> None:
    """What the tuner looks for: the bound, the objective and its settings."""
    parser.add_argument("--latency-bound-ms", type=flags.number(0, above=True), metavar="MS",
                        help="the bound on the end-to-end percentile; --objective streams takes --deadline-ms in its "
                             "place (default: required, except there)")
    parser.add_argument("--percentile", type=flags.number(0, above=True, below=100), default=99.0,
                        help="the percentile the bound applies to (default 99)")
    parser.add_argument("--objective", choices=("throughput", "devices", "streams"), default="throughput",
                        help="most items/s under the bound, the fewest devices serving --target-rate, or the most "
                             "camera streams at --fps (default throughput)")
    parser.add_argument("--fps", type=flags.number(0, above=True), metavar="F",
                        help="each stream's frame rate under --objective streams (default: none)")
    parser.add_argument("--streams-bound", type=flags.number(0), default=DEFAULT_BOUND, metavar="FRACTION",
                        help="under --objective streams, the fraction of frames that may finish past their deadline "
                             f"(default {DEFAULT_BOUND:g})")
    parser.add_argument("--deadline-ms", type=flags.number(0, above=True), metavar="MS",
                        help="under --objective streams, how long after it falls due a frame may finish (default: the "
                             "config's run.deadline_ms, else one frame period)")
    parser.add_argument("--target-rate", type=flags.number(0, above=True), metavar="R",
                        help="items/s the devices objective must serve under the bound (default: none)")


def add_search_flags(parser: flags.CommandParser) -> None:
    """How the candidates are found: the search, the engine, the profiles and simulations."""
    parser.add_argument("--search", choices=("auto", "exhaustive", "quick", "optuna"), default="auto",
                        help="auto: exhaustive up to 256 candidates, else quick; optuna: TPE over the same space "
                             "(default auto)")
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                        help=f"the engine every job runs on: {engines_help()} (default {DEFAULT_ENGINE})")
    parser.add_argument("--out", required=True, type=Path, help="directory of profiles, jobs and the report (required)")
    parser.add_argument(*flags.BATCH, "--batch", dest="batch", type=flags.integers(1), metavar="LIST",
                        help="batch sizes of every Batcher whose config gives no list (default: the config's value, "
                             "else 1,2,4,8)")
    parser.add_argument("--segments", type=flags.integers(1), metavar="LIST",
                        help="num_segments to try on every step a later step merges (default: the config's)")
    parser.add_argument("--max-replicas", type=flags.integer(1), metavar="N",
                        help="most replicas of one group (default: what the budget allows)")
    parser.add_argument("--top", type=flags.integer(1), default=3, metavar="N", help="finalists run for real (default 3)")
    parser.add_argument("--profile-calls", type=flags.integer(1), default=150, metavar="N",
                        help="calls per profiling job (default 150)")
    parser.add_argument("--sim-items", type=flags.integer(1), default=DEFAULT_ITEMS, metavar="N",
                        help=f"items per simulation (default {DEFAULT_ITEMS})")
    parser.add_argument("--trials", type=flags.integer(1), default=60, metavar="N",
                        help="Optuna trials of --search optuna (default 60)")


def add_verify_flags(parser: flags.CommandParser) -> None:
    """How the finalists are run for real."""
    parser.add_argument("--verify-steps", type=flags.integer(0), default=3, metavar="N",
                        help="bisection steps per finalist after its two ends (default 3)")
    parser.add_argument("--verify-seconds", type=flags.number(0, above=True), default=3.0, metavar="S",
                        help="a verification job's length in seconds of requests at its rate (default 3)")
    parser.add_argument("--verify-repeats", type=flags.integer(1), default=1, metavar="N",
                        help="jobs per verified rate, on a host whose speed drifts: their majority decides, stopping "
                             "once it is decided (default 1)")
    parser.add_argument("--warmup", type=flags.integer(0), default=20, metavar="N",
                        help="warm-up items of each verification job (default 20)")
    add_job_rules(parser)
    parser.add_argument("--seed", type=flags.integer(0), default=0, metavar="N",
                        help="seed of the simulations and of Optuna (default 0)")
    parser.add_argument("--ray-address", help="the Ray cluster of --engine ray, passed to every job (default: as "
                                              "benchmark.py finds one)")


def check_flags(parser: flags.CommandParser, args: argparse.Namespace) -> None:
    """The flags that only make sense together, refused (exit 2) before anything runs."""
    if not args.gpus and args.cpu_slots == 0:
        parser.refuse("--gpus/--cpu-slots", "expected the budget, --gpus LIST and/or --cpu-slots N (N >= 1), found neither")
    if args.objective == "devices" and args.target_rate is None:
        parser.refuse("--target-rate", "expected the items/s that --objective devices must serve, found none")
    if args.objective == "streams" and args.fps is None:
        parser.refuse("--fps", "expected each stream's frame rate beside --objective streams, found none")
    if args.objective == "streams" and args.latency_bound_ms is not None:
        parser.refuse("--latency-bound-ms", "expected none beside --objective streams, whose frames' bound is "
                                            f"--deadline-ms, found {args.latency_bound_ms:g}")
    if args.objective != "streams" and args.latency_bound_ms is None:
        parser.refuse("--latency-bound-ms", "expected a value (rnb-tune requires it, except under --objective "
                                          "streams), found none")
    if args.streams_bound > 1:
        parser.refuse("--streams-bound", f"expected a fraction from 0 to 1, found {args.streams_bound:g}")
