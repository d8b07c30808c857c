"""Summarize RnB job logs: a terminal table, exports, plots and a two-job comparison.

    python scripts/analyze.py                       # every job under logs/
    python scripts/analyze.py logs/261130_0915* --csv jobs.csv --plot jobs.png
    python scripts/analyze.py logs --compare JOB_A JOB_B
    python scripts/analyze.py logs/JOB --html job.html      # one self-contained page of the job

Exit codes: 0 success, 2 bad arguments, no jobs, or an unreadable job file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rnb.analysis.html import write_job_page
from rnb.analysis.job_dirs import find_job_dirs, incomplete_job, is_complete, read_job
from rnb.analysis.jobs import JSON_COLUMNS, JobLogError, JobTables, ValidityRules, load_jobs
from rnb.analysis.plots import left_out_sentence, plot_jobs
from rnb.analysis.report import format_compare, format_report
from rnb.analysis.trace import write_trace
from rnb.console import terminal_logging
from rnb.core.joblog import META_FILE, SPOOL_DIR

DEFAULTS = ValidityRules()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=["logs"], help="log directories or job directories (default: logs)")
    parser.add_argument("--min-duration", type=float, default=DEFAULTS.min_duration_s,
                        help=f"seconds the measured window must last to be VALID (default {DEFAULTS.min_duration_s:g})")
    parser.add_argument("--min-items", type=int, default=DEFAULTS.min_items,
                        help=f"items after warm-up needed to be VALID (default {DEFAULTS.min_items})")
    parser.add_argument("--csv", metavar="FILE", help="write the jobs table as CSV")
    parser.add_argument("--json", metavar="FILE", help="write the jobs table as a JSON list of objects")
    parser.add_argument("--parquet", metavar="FILE", help="write the jobs table as Parquet")
    parser.add_argument("--items-parquet", metavar="FILE", help="write the per-item table of all jobs as Parquet")
    parser.add_argument("--plot", metavar="FILE.png", help="write stacked stage latencies (and load curves) as PNG")
    parser.add_argument("--trace", metavar="FILE.json",
                        help="write one job's timeline as Chrome trace-event JSON (Perfetto's UI, chrome://tracing)")
    parser.add_argument("--html", metavar="FILE.html",
                        help="write one job's stage table, bottleneck and plots as one self-contained HTML page")
    parser.add_argument("--compare", nargs=2, metavar=("JOB_A", "JOB_B"),
                        help="show two jobs (ids under PATHS, or job directories) side by side with ratios B/A")
    args = parser.parse_args(argv)
    if args.min_duration < 0 or args.min_items < 0:
        parser.error("--min-duration and --min-items must not be negative")
    return args


def load_compared(args: argparse.Namespace, rules: ValidityRules) -> JobTables:
    """The two compared jobs, in order; each named by a job directory or an id under the given paths."""
    named = [Path(name) for name in args.compare]
    if all(path.is_dir() for path in named):
        return load_jobs(named, rules=rules)
    return load_jobs(args.paths, names=[path.name for path in named], rules=rules)


def one_job(args: argparse.Namespace, flag: str, what: str) -> Path:
    """The one job the paths name, for a flag that writes one job's view (--trace, --html)."""
    found = find_job_dirs(args.paths)
    if len(found) != 1:
        pick = f"; name one job's directory, such as {found[-1]}" if found else ""
        raise JobLogError(f"{flag} writes one job's {what}; {', '.join(args.paths)} holds {len(found)} jobs{pick}.")
    return found[0]


def export(tables: JobTables, args: argparse.Namespace) -> None:
    if args.csv:
        pcsv.write_csv(tables.jobs, args.csv)
    if args.parquet:
        pq.write_table(tables.jobs, args.parquet)
    if args.items_parquet:
        pq.write_table(tables.items, args.items_parquet)
    if args.json:
        rows = tables.jobs.to_pylist()
        for row in rows:
            row.update({column: json.loads(row[column]) for column in JSON_COLUMNS if row.get(column) is not None})
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    if args.plot:
        said = left_out_sentence("analyze", plot_jobs(tables.jobs, args.plot))
        if said:
            print(said, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with terminal_logging("analyze"):
        return _analyze(args)


def _analyze(args: argparse.Namespace) -> int:
    rules = ValidityRules(min_duration_s=args.min_duration, min_items=args.min_items)
    incomplete = []
    tables: JobTables | None
    try:
        if args.trace:
            write_trace(read_job(one_job(args, "--trace", "timeline")), args.trace)
        if args.html:
            write_job_page(one_job(args, "--html", "page"), args.html, rules)
        if args.compare:
            tables = load_compared(args, rules)
        else:
            dirs = find_job_dirs(args.paths)
            # A job without meta.json (running, or its main process killed) is listed, not a reason to fail.
            incomplete = [incomplete_job(path) for path in dirs if not is_complete(path)]
            complete = [path for path in dirs if is_complete(path)]
            tables = load_jobs(complete, rules=rules) if complete else None
        if tables is not None:
            export(tables, args)
    except JobLogError as exc:
        print(f"analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"analyze: cannot write {exc.filename}: {exc.strerror}.", file=sys.stderr)
        return 2
    if tables is not None and args.compare:
        job_a, job_b = tables.jobs.to_pylist()
        print(format_compare(job_a, job_b))
    elif tables is not None:
        print(format_report(tables.jobs))
    for job in incomplete:
        why = ("its log directory refused timings.parquet" if (job.path / META_FILE).is_file() else
               "no meta.json, so the job is still running or its main process was killed")
        print(f"{job.job_id}: INCOMPLETE: {why}; {job.spooled_items} finished items are in {job.path / SPOOL_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
