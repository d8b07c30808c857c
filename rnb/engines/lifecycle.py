"""A job's life as every driver lives it, written once: from its log opened to the ending its log records.

A driver (rnb.engines.local.driver, rnb.engines.ray.driver) starts its
processes its own way, and lives the rest through a `JobLife`: the
timings streamed to disk (TimingsSpool), the samples of CPU, memory and
GPUs (Sampler), the live progress on stderr, the stall or maximum
duration watched (JobWatch), and, whatever way the job ends, the same
closing: progress closed, sampler stopped, samples written, each
process's kept Python stacks recorded, the stall's sentence or the
failure's, the JobEnding.  Ctrl-C and SIGTERM are the driver's through
`STOPS.reacting` around its run (rnb.engines.stopping).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rnb.core.joblog import SAMPLES_FILE
from rnb.core.records import JsonObject
from rnb.core.termination import Termination
from rnb.engines.job import JobBook, JobEnding, RunArgs, error_sentence
from rnb.engines.live import LiveProgress, progress_mode
from rnb.engines.sampler import SampledGpu, Sampler
from rnb.engines.spool import TimingsSpool
from rnb.engines.stall import JobWatch, Stall, kept_stacks, stall_error


class JobLife:
    """What a driver keeps of its job from the log's opening to its ending."""

    def __init__(self, job_dir: Path, args: RunArgs, num_steps: int, runners: Sequence[str],
                 gpus: Sequence[SampledGpu] = ()) -> None:
        self.job_dir = job_dir
        self.args = args
        self.spool = TimingsSpool(job_dir, num_steps, args.warmup)
        self.sampler = Sampler(args.sample_interval_ms / 1000.0, tuple(gpus))
        self.live = LiveProgress(["client", *runners], args.videos, progress_mode(args.quiet, sys.stderr))
        self.watch = JobWatch(args.stall_s, args.max_duration_s, time.time())
        self.stall: Stall | None = None   # the stall that ended the job, if one did

    def watch_from_now(self) -> None:
        """Start-up's watch begins now (an engine whose processes take a while to be placed begins it once they are)."""
        self.watch = JobWatch(self.args.stall_s, self.args.max_duration_s, time.time())

    def wind_down(self) -> None:
        """Once every process is stopped: the progress closed, the sampler stopped, its samples written."""
        self.live.close(self.spool.rows)
        self.sampler.stop()
        self.spool.writes.attempt(self.job_dir / SAMPLES_FILE, lambda: self.sampler.write(self.job_dir))

    def ending(self, book: JobBook, start: float | None, end: float, reason: Termination, *, setup_error: str | None = None,
               engine: JsonObject | None = None, counted: int | None = None) -> JobEnding:
        """How the job ended: each process's kept stacks recorded in `book`, the one error sentence (the setup's, the
        stall's, the failure's), what the final step counted (None before the start)."""
        stacks = kept_stacks(self.job_dir)
        for name, path in stacks.items():
            book.update(name, stacks=path)
        stalled = stall_error(self.stall, self.job_dir, stacks) if self.stall else None
        return JobEnding(start=start, end=end, reason=reason,
                         error=setup_error or error_sentence(reason, book.failure, self.args, stalled), spool=self.spool,
                         book=book, engine=engine or {"name": self.args.engine}, counted=counted)
