"""Run the benchmark at several loads and compare them, or search for the peak rate under a latency bound.

    python scripts/sweep.py -c config/toy.json -mi 0,1,2,5,10 -v 200
    python scripts/sweep.py -c config/toy.json --latency-bound-ms 50 --percentile 99 --low-mi 20 --high-mi 1
    python scripts/sweep.py -c config/streams-example.json --fps 30 --streams-bound 0.01 --json streams.json

The search uses VALID jobs only (as analyze.py judges them): a job too short to
be VALID runs again with a larger -v, at most --max-reruns times.

Flags this script does not know (e.g. -b, -qs, --warmup, --cpu) go on to every benchmark.py run.
Exit codes: 0 success, 1 a search found no load (no rate, or not even one stream) that meets its bound,
2 bad arguments or a run the sweep cannot use, 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import rnb.flags as flags
from rnb.analysis.jobs import JobLogError, ValidityRules, load_jobs
from rnb.analysis.plots import left_out_sentence, plot_jobs
from rnb.analysis.report import format_summary
from rnb.analysis.stream_search import (
    StreamTrial,
    bound_sentence,
    format_stream_search,
    measure_streams,
    search_streams,
)
from rnb.analysis.sweep import (
    BENCHMARK,
    RunOutcome,
    SweepError,
    Trial,
    bisect_rate,
    format_bisection,
    measure_valid,
    run_benchmark,
)
from rnb.console import terminal_logging
from rnb.load import LOAD_KEYS

DEFAULTS = ValidityRules()
BENCHMARK_FLAGS = frozenset((*flags.BENCHMARK, *(spelling for key in LOAD_KEYS.values() for spelling in key.spellings)))
PASSED_ON = ("Flags that sweep.py does not know (-b, -qs, --warmup, --cpu, --engine, ... : benchmark.py --help) go on "
             "to every benchmark.py run.")


def add_job_rules(parser: argparse.ArgumentParser) -> None:
    """How long a job may run and when it counts (VALID), and how often one too short runs again: the flags of
    the sweep and of the tuner, whose jobs run through the sweep."""
    parser.add_argument("--timeout", type=flags.number(0, above=True), metavar="S",
                        help="seconds one job may take before it is interrupted (default: no limit)")
    parser.add_argument("--min-duration", type=flags.number(0), default=DEFAULTS.min_duration_s, metavar="S",
                        help=f"validity rule, as in analyze.py (default {DEFAULTS.min_duration_s:g})")
    parser.add_argument("--min-items", type=flags.integer(0), default=DEFAULTS.min_items, metavar="N",
                        help=f"validity rule, as in analyze.py (default {DEFAULTS.min_items})")
    parser.add_argument("--max-reruns", type=flags.integer(0), default=3, metavar="N",
                        help="longer re-runs of a job too short to be VALID before giving up on its load (default 3)")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = flags.CommandParser("sweep.py", __doc__.split("\n")[0], epilog=PASSED_ON)
    parser.add_argument(*flags.CONFIG, dest="config_file_path", required=True, help="pipeline config JSON (required)")
    parser.add_argument(*flags.MEAN_INTERVAL, "--mi", dest="mi", metavar="MS,...", type=flags.numbers(0),
                        help="the -mi values to run, comma-separated, e.g. 0,1,2,5,10 (default: none; give these "
                             "or --latency-bound-ms)")
    parser.add_argument("--latency-bound-ms", type=flags.number(0, above=True), metavar="MS",
                        help="search for the highest rate whose latency stays under this (default: none; give this "
                             "or -mi)")
    parser.add_argument("--percentile", type=flags.number(0, above=True), default=99.0,
                        help="latency percentile the bound applies to, at most 100 (default 99)")
    parser.add_argument("--low-mi", type=flags.number(0, above=True), default=20.0, metavar="MS",
                        help="-mi of the lowest rate searched (default 20)")
    parser.add_argument("--high-mi", type=flags.number(0, above=True), default=1.0, metavar="MS",
                        help="-mi of the highest rate searched (default 1)")
    parser.add_argument("--max-steps", type=flags.integer(0), default=4, metavar="N",
                        help="bisection steps after the two ends (default 4)")
    parser.add_argument(*flags.VIDEOS, dest="videos", type=flags.integer(1), metavar="N",
                        help="requests per run, passed to the benchmark (default: the config's, else 2000)")
    parser.add_argument("--log-dir", type=Path, default=Path("logs"), help="where the runs write their job logs (default logs)")
    parser.add_argument("--benchmark", type=Path, default=BENCHMARK, help="the benchmark script to run (default: this repo's)")
    add_job_rules(parser)
    parser.add_argument("--plot", metavar="FILE.png", help="plot the runs as analyze.py --plot does (default: no plot)")
    add_stream_search(parser)
    args, extra = parser.parse_passing_on(argv, BENCHMARK_FLAGS, "benchmark.py")
    if args.streams_bound is not None:
        check_stream_search(parser, args)
    elif (args.mi is None) == (args.latency_bound_ms is None):
        parser.refuse(flags.MEAN_INTERVAL, "expected either the loads to run (-mi 0,1,2,5) or a search for the peak "
                      "rate (--latency-bound-ms MS), found " + ("neither" if args.mi is None else "both"))
    if args.latency_bound_ms is not None:
        if not args.high_mi < args.low_mi:
            parser.refuse("--high-mi", f"expected less than --low-mi {args.low_mi:g} (a smaller interval is a higher "
                          f"rate), found {args.high_mi:g}")
        if args.percentile > 100:
            parser.refuse("--percentile", f"expected a number > 0 and <= 100, found {args.percentile:g}")
    if args.videos is not None:
        extra = ["-v", str(args.videos), *extra]
    return args, extra


def add_stream_search(parser: flags.CommandParser) -> None:
    parser.add_argument("--streams-bound", type=flags.number(0), metavar="FRACTION",
                        help="search for the most camera streams at --fps whose missed frames (late, and dropped "
                             "under --stream-policy drop) stay at or under FRACTION of those offered (default: none)")
    parser.add_argument("--fps", type=flags.number(0, above=True), metavar="F",
                        help="frames per second of each stream in the stream search (default: none; required with "
                             "--streams-bound)")
    parser.add_argument("--max-streams", type=flags.integer(1), default=256, metavar="N",
                        help="the most streams the stream search tries (default 256)")
    parser.add_argument("--json", metavar="FILE", help="with --streams-bound: write {\"streams\", \"fps\", \"jobs\"} "
                                                       "to FILE (default: none)")


def check_stream_search(parser: flags.CommandParser, args: argparse.Namespace) -> None:
    if args.streams_bound > 1:
        parser.refuse("--streams-bound", f"expected a fraction from 0 to 1, found {args.streams_bound:g}")
    if args.fps is None:
        parser.refuse("--streams-bound", "expected --fps F beside it (the frame rate of each stream), found none")
    if args.mi is not None:
        parser.refuse("--streams-bound", "expected no -mi beside it (the stream search sets the load), found -mi")
    if args.percentile > 100:
        parser.refuse("--percentile", f"expected a number > 0 and <= 100, found {args.percentile:g}")


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    with terminal_logging("sweep"):
        return _sweep(args, extra)


def _sweep(args: argparse.Namespace, extra: list[str]) -> int:
    rules = ValidityRules(min_duration_s=args.min_duration, min_items=args.min_items)

    def run(mean_interval_ms: float, videos: int | None = None) -> RunOutcome:
        longer = ["-v", str(videos)] if videos is not None else []   # the last -v wins
        return run_benchmark(args.config_file_path, mean_interval_ms, args.log_dir, [*extra, *longer],
                             args.benchmark, args.timeout)

    def measure(rate_per_s: float) -> Trial:
        return measure_valid(run, rate_per_s, args.percentile, rules, args.max_reruns)

    if args.streams_bound is not None:
        return _stream_search(args, extra, rules)

    def search() -> tuple[list[Path], str, bool]:
        if args.mi is not None:
            return [run(mi).job_dir for mi in args.mi], "", True
        result = bisect_rate(measure, 1000.0 / args.low_mi, 1000.0 / args.high_mi, args.latency_bound_ms, args.max_steps)
        job_dirs = [trial.job_dir for trial in result.trials if trial.job_dir is not None]  # every one measured has
        return job_dirs, format_bisection(result, args.percentile), result.best is not None

    return _reported(args, rules, search)


def _reported(args: argparse.Namespace, rules: ValidityRules,
              search: Callable[[], tuple[list[Path], str, bool]]) -> int:
    """Run a search (its jobs, its report, whether a load met the bound), plot its jobs if asked, print them and the
    report; the exit code (1 when no load met the bound)."""
    try:
        job_dirs, report, met = search()
        jobs = load_jobs(job_dirs, rules=rules).jobs
        said = left_out_sentence("sweep", plot_jobs(jobs, args.plot)) if args.plot else None
        if said:
            print(said, file=sys.stderr)
    except (SweepError, JobLogError, OSError) as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted.", file=sys.stderr)
        return 130
    print(format_summary(jobs))
    if report:
        print("\n" + report)
    return 0 if met else 1


def _stream_search(args: argparse.Namespace, extra: list[str], rules: ValidityRules) -> int:
    """sweep.py --streams-bound: the most streams at --fps, printed, and with --json written."""
    def run(streams: int, videos: int | None) -> RunOutcome:
        longer = ["-v", str(videos)] if videos is not None else []   # the last -v wins
        return run_benchmark(args.config_file_path, 0.0, args.log_dir, [*extra, *longer], args.benchmark, args.timeout,
                             load=["--streams", str(streams), "--fps", f"{args.fps:g}"])

    def passes(trial: StreamTrial) -> bool:
        return trial.missed_fraction <= args.streams_bound and (
            args.latency_bound_ms is None or trial.latency_ms < args.latency_bound_ms)

    def search() -> tuple[list[Path], str, bool]:
        result = search_streams(lambda n: measure_streams(run, n, args.percentile, rules, args.max_reruns), passes,
                                args.max_streams)
        job_dirs = [job_dir for trial in result.trials for job_dir in trial.job_dirs]
        if args.json:
            Path(args.json).write_text(json.dumps({"streams": result.best, "fps": args.fps, "bound": bound_sentence(result),
                                                   "jobs": [str(job_dir) for job_dir in job_dirs]}, indent=1))
        text = format_stream_search(result, args.fps, args.streams_bound, args.latency_bound_ms, args.percentile)
        return job_dirs, f"{text}\n{result.best}", result.best > 0

    return _reported(args, rules, search)

if __name__ == "__main__":
    sys.exit(main())
