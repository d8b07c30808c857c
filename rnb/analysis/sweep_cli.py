"""Run the benchmark at several loads and compare them, or search for the peak rate under a latency bound.

    python scripts/sweep.py -c config/toy.json --mi 0,1,2,5,10 -v 200
    python scripts/sweep.py -c config/toy.json --latency-bound-ms 50 --percentile 99 --low-mi 20 --high-mi 1

The search uses VALID jobs only (as analyze.py judges them): a job too short to
be VALID runs again with a larger -v, at most --max-reruns times.

Flags this script does not know (e.g. -b, -qs) are passed to every benchmark run.
Exit codes: 0 success, 2 bad arguments or a run the sweep cannot use, 130 interrupted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rnb.analysis.jobs import JobLogError, ValidityRules, load_jobs
from rnb.analysis.report import format_summary, plot_jobs
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

OWN_INTERVAL_FLAGS = ("-mi", "--mean_interval_ms")
DEFAULTS = ValidityRules()


def interval_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers of milliseconds, got {text!r}") from None
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected one or more non-negative intervals, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("-c", "--config_file_path", required=True, help="pipeline config JSON")
    modes = parser.add_mutually_exclusive_group(required=True)
    modes.add_argument("--mi", type=interval_list, help="comma-separated -mi values to run, e.g. 0,1,2,5,10")
    modes.add_argument("--latency-bound-ms", type=float, help="search for the highest rate whose latency stays under this")
    parser.add_argument("--percentile", type=float, default=99.0, help="latency percentile the bound applies to (default 99)")
    parser.add_argument("--low-mi", type=float, default=20.0, help="-mi of the lowest rate searched (default 20)")
    parser.add_argument("--high-mi", type=float, default=1.0, help="-mi of the highest rate searched (default 1)")
    parser.add_argument("--max-steps", type=int, default=4, help="bisection steps after the two ends (default 4)")
    parser.add_argument("-v", "--videos", help="requests per run, passed to the benchmark")
    parser.add_argument("--log-dir", type=Path, default=Path("logs"), help="where the runs write their job logs (default logs)")
    parser.add_argument("--benchmark", type=Path, default=BENCHMARK, help="the benchmark script to run (default: this repo's)")
    parser.add_argument("--timeout", type=float, help="seconds one run may take before it is interrupted")
    parser.add_argument("--min-duration", type=float, default=DEFAULTS.min_duration_s, help="validity rule, as in analyze.py")
    parser.add_argument("--min-items", type=int, default=DEFAULTS.min_items, help="validity rule, as in analyze.py")
    parser.add_argument("--max-reruns", type=int, default=3,
                        help="longer re-runs of a search job too short to be VALID before the sweep gives up (default 3)")
    parser.add_argument("--plot", metavar="FILE.png", help="plot the runs as analyze.py --plot does")
    args, extra = parser.parse_known_args(argv)
    if any(flag in extra for flag in OWN_INTERVAL_FLAGS):
        parser.error("give loads with --mi (a list) or search with --latency-bound-ms, not -mi")
    if args.latency_bound_ms is not None:
        if args.latency_bound_ms <= 0:
            parser.error("--latency-bound-ms must be positive")
        if not 0 < args.high_mi < args.low_mi:
            parser.error("--high-mi must be positive and smaller than --low-mi (a smaller interval is a higher rate)")
        if not 0 < args.percentile <= 100:
            parser.error("--percentile must be in (0, 100]")
        if args.max_steps < 0 or args.max_reruns < 0:
            parser.error("--max-steps and --max-reruns must not be negative")
    if args.videos is not None:
        extra = ["-v", args.videos, *extra]
    return args, extra


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

    try:
        if args.mi is not None:
            job_dirs = [run(mi).job_dir for mi in args.mi]
            report = ""
        else:
            result = bisect_rate(measure, 1000.0 / args.low_mi, 1000.0 / args.high_mi,
                                 args.latency_bound_ms, args.max_steps)
            job_dirs = [trial.job_dir for trial in result.trials if trial.job_dir is not None]  # every one measured has
            report = format_bisection(result, args.percentile)
        jobs = load_jobs(job_dirs, rules=rules).jobs
        if args.plot:
            plot_jobs(jobs, args.plot)
    except (SweepError, JobLogError) as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted.", file=sys.stderr)
        return 130
    print(format_summary(jobs))
    if report:
        print("\n" + report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
