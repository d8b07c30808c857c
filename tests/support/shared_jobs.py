"""Jobs that tests of several modules only read, each run once per test session.

A job costs seconds of start-up, every process of it importing torch, so
checks that only read what one job left (its log, what it printed) share
it instead of each starting its own.  A test that changes the log copies it
first.
"""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]


class SharedJob(NamedTuple):
    """A finished job: how benchmark.py ended and what it printed, and the log directory holding its one job."""

    done: subprocess.CompletedProcess[str]
    log_dir: Path


# 400 requests (390 after the default warm-up: enough to bound the p99, so analysis can call the job VALID),
# all at once into a request queue of -qs 12, which bulk mode must enlarge to hold them; the runners' CPU
# sampled every 10 ms, for the end-of-run utilisation summary.
BULK_TOY_VIDEOS = 400
BULK_TOY_ARGS = ("-c", "config/toy.json", "-v", str(BULK_TOY_VIDEOS), "-mi", "0", "-qs", "12",
                 "--sample-interval-ms", "10")


@functools.cache
def bulk_toy_job(base: Path) -> SharedJob:
    """config/toy.json run with BULK_TOY_ARGS, its log under `base` (the session's pytest base temp directory)."""
    log_dir = base / "shared-bulk-toy"
    done = subprocess.run([sys.executable, "benchmark.py", *BULK_TOY_ARGS, "--log-dir", str(log_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    return SharedJob(done, log_dir)
