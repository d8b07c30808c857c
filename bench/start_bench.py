"""P12: how long a job's child takes to start, forked from the fork server against spawned afresh; P12j and
P12jd: a whole short job (toy; the default config's episodes and R(2+1)D) with the server started first against at
the first child.

Each side starts one child exactly as the local engine does (a Lifeline
first among its arguments, through `spawning_children`), which imports the
runner's module, as a runner does, and then reports; the figure is the time
from `start()` to that report.  The fork server's own start (its import of
torch, once per main process) is left out of side A: one warm-up start pays
it, as a job's first child does.
"""
from __future__ import annotations

import multiprocessing
import subprocess
import sys
import tempfile
import time
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.queues import Queue
from pathlib import Path

import torch  # noqa: F401 - the fork server preloads what this process has imported, as the main process of a job

from bench.common import Effort, Goal, Row, measure_pair
from rnb.engines.local.lifeline import Lifeline, children_context, run, spawning_children

STARTS_PER_REP = 3
REPO = Path(__file__).resolve().parents[1]


def report_started(queue: Queue) -> None:
    """The child: import what a runner imports, then say so."""
    import rnb.engines.runner  # noqa: F401
    queue.put(time.monotonic())


def start_seconds(ctx: ForkServerContext | SpawnContext, queue: Queue) -> float:
    """Mean seconds from start() to the child's report, over STARTS_PER_REP children started one after another."""
    total = 0.0
    for _ in range(STARTS_PER_REP):
        began = time.monotonic()
        child = ctx.Process(target=run, args=(Lifeline(), f"{__name__}.report_started", queue), daemon=True)
        with spawning_children():
            child.start()
        total += queue.get(timeout=120) - began
        child.join(30)
    return total / STARTS_PER_REP


def p12_child_start(effort: Effort) -> list[Row]:
    forked, spawned = children_context(), multiprocessing.get_context("spawn")
    replies = {"fork": forked.Queue(), "spawn": spawned.Queue()}
    return [measure_pair(
        "P12", "a child's start to its first message, importing the runner's modules: fork server / spawn",
        Goal("<=", 0.25), ("fork server", "s", lambda: start_seconds(forked, replies["fork"])),
        ("spawn", "s", lambda: start_seconds(spawned, replies["spawn"])), effort.reps,
        note=f"{STARTS_PER_REP} children per rep, one after another; the bound is the fork itself (a few ms): "
             "a spawned child imports torch before anything (about 2 s of CPU here), a forked one finds it "
             "loaded; the server's own start is paid once per main process, in the warm-up")]


# A whole command started by hand without rnb.launch: the fork server starts at the job's first child, as before.
SERVER_AT_FIRST_CHILD = "import sys; from rnb.cli import main; sys.exit(main())"


def job_seconds(command: list[str], log_dir: Path, config: str) -> float:
    """Wall seconds of one short job of `config` (10 items), from exec to exit."""
    began = time.monotonic()
    subprocess.run([*command, "-c", str(REPO / "config" / config), "-v", "10", "-mi", "0", "--warmup", "0",
                    "--log-dir", str(log_dir), "-q"], cwd=REPO, check=True, capture_output=True, timeout=300)
    return time.monotonic() - began


def p12j_job_start(effort: Effort) -> list[Row]:
    logs = Path(tempfile.mkdtemp(prefix="rnb-P12j-"))
    first, at_child = [sys.executable, "benchmark.py"], [sys.executable, "-c", SERVER_AT_FIRST_CHILD]
    return [measure_pair(
        "P12j", "a short toy job from exec to exit: fork server started first (benchmark.py) / at the first child",
        Goal("<=", 0.8), ("server first", "s", lambda: job_seconds(first, logs, "toy.json")),
        ("at first child", "s", lambda: job_seconds(at_child, logs, "toy.json")),
        effort.reps,
        note="10 items of config/toy.json; the bound is the job less the server's import of torch (about 2 s "
             "here), which with the server started first runs on the second core beside the main process's own"),
        measure_pair(
        "P12jd", "a short episode job (config/default.json) from exec to exit: fork server started first "
                 "(benchmark.py) / at the first child",
        Goal("<=", 0.8), ("server first", "s", lambda: job_seconds(first, logs, "default.json")),
        ("at first child", "s", lambda: job_seconds(at_child, logs, "default.json")),
        effort.reps,
        note="10 items of the default config (the synthetic episodes, R(2+1)D at 32x32); the bound is the job less "
             "the server's import of torch, torchvision and torchcodec (about 3 s here), which with the server "
             "started first (what it imports guessed from the config) runs beside the main process's own")]
