"""Ctrl-C and SIGTERM at each instant of a job's start-up, on both engines: the reliability bench's start-up rows.

Each instant is a state of the job seen from outside, in /proc: the main
process importing torch (libtorch mapped, no log directory yet), its first
child waiting for the fork server to finish its imports (made slow here:
the server, started first, imports what the config needs beside the main
process and is most often done before the first child),
its children being spawned or loading their models, Ray starting (a GCS or
raylet among its descendants), Ray's actors being created or loading theirs,
and the start barrier passing.  A trial waits for its instant, sends its
signal to the job's whole process group, and must end with exit 130
(SIGINT) or 143 (SIGTERM), one line saying so on stderr and no traceback,
every process of the job gone within GONE_BOUND_S of the signal, and a log
directory only with meta.json saying `interrupted` or `terminated`, or no
log directory at all.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.fault_jobs import MARK, REPO, JobRun, children, command_line, fork_server_of, waiting_for_fork_server

GONE_BOUND_S = 3.0          # every process of the job gone within this of the signal
WAIT_FOR_INSTANT_S = 120.0  # an instant not seen by then was missed (the trial fails)
# The signals a start-up row's trials take turns with: (signal, exit code, termination_reason, what the line says).
TURNS = ((signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"))

Probe = Callable[[int, Path], bool]   # (the main process's pid, the trial's log directory) -> the instant has come
# Makes the fork server's (and any spawned child's) import of torch that much slower: tests/support/slow_imports.
SLOW_IMPORTS = REPO / "tests" / "support" / "slow_imports"


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def job_dirs(logs: Path) -> list[Path]:
    return [path for path in logs.glob("*") if path.is_dir()] if logs.is_dir() else []


def importing_torch(pid: int, logs: Path) -> bool:
    """torch's libraries are mapped and no log directory exists: the main process is in its imports."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return False
    return b"libtorch" in maps and not job_dirs(logs)


def spawning(pid: int, logs: Path) -> bool:
    """The log directory exists and the fork server has forked the job's first child (the early server, still
    importing torch, may run a short-lived program of its own: that is not a child of the job)."""
    server = fork_server_of(pid)
    return server is not None and bool(job_dirs(logs)) and bool(children(server))


def loading_models(count: int) -> Probe:
    """All `count` children are forked (one loads a model that never finishes loading)."""
    def probe(pid: int, logs: Path) -> bool:
        server = fork_server_of(pid)
        return server is not None and len(children(server)) >= count
    return probe


def ray_starting(pid: int, logs: Path) -> bool:
    """A GCS or raylet of the job's own Ray runs, and no log directory exists yet."""
    return not job_dirs(logs) and any(Path(os.fsdecode(command_line(child).split(b"\0")[0])).name in ("gcs_server", "raylet")
                                      for child in descendants(pid))


def creating_actors(pid: int, logs: Path) -> bool:
    """The log directory exists (it is opened before the actors are created)."""
    return bool(job_dirs(logs))


def actors_loading(pid: int, logs: Path) -> bool:
    """A runner actor of the job exists (its process carries the job's mark), so its `run`, which loads its model, is
    under way or about to be: for a model that never finishes loading."""
    mark = next((entry for entry in _environ(pid) if entry.startswith(f"{MARK}=".encode())), None)
    return mark is not None and bool(job_dirs(logs)) and any(
        b"RunnerActor" in command_line(int(entry.name)) and mark in _environ(int(entry.name))
        for entry in Path("/proc").iterdir() if entry.name.isdigit())


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def started(stderr: Path) -> Probe:
    return lambda pid, logs: "started" in stderr.read_text()


@dataclass(frozen=True)
class Instant:
    """One instant of start-up: its name, what it means, the job it needs, and how it is seen from outside."""

    name: str
    what: str
    argv: tuple[str, ...]          # benchmark.py's arguments besides the config and --log-dir
    config: str                    # "toy", "hangs" (a step whose model never finishes loading) or "default"
    probe: Callable[[Path], Probe]  # the trial's stderr file -> its probe
    settle_s: float = 0.0          # once seen, how long to wait before the signal
    server_import_delay_s: float = 0.0   # how much slower the fork server imports torch, for an instant that waits on it

    def env(self) -> dict[str, str]:
        """What the trial's environment adds: the slow import, where the instant needs one."""
        if not self.server_import_delay_s:
            return {}
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(SLOW_IMPORTS), str(REPO), os.environ.get("PYTHONPATH")])),
                "RNB_TEST_IMPORT_DELAY_S": str(self.server_import_delay_s)}


LOCAL = ("-v", "100000", "-mi", "20", "--warmup", "0", "-q")
RAY = (*LOCAL, "--engine", "ray")
INSTANTS = (
    Instant("imports", "the main process imports torch", LOCAL, "toy", lambda err: importing_torch),
    Instant("fork-server", "the first child waits for the fork server to finish importing (made 10 s slower)",
            (*LOCAL, "--cpu"), "default", lambda err: waiting_for_fork_server, server_import_delay_s=10.0),
    Instant("spawning", "the fork server forks the job's children", LOCAL, "hangs", lambda err: spawning),
    Instant("loading", "the children load their models (one never finishes)", LOCAL, "hangs",
            lambda err: loading_models(3), settle_s=0.5),
    Instant("start", "the start barrier passes", LOCAL, "toy", started),
    Instant("ray-imports", "the main process imports torch (--engine ray)", RAY, "toy", lambda err: importing_torch),
    Instant("ray-start", "Ray starts for the job (ray.init)", RAY, "toy", lambda err: ray_starting),
    Instant("ray-actors", "the job's actors are being created", RAY, "toy", lambda err: creating_actors),
    Instant("ray-loading", "the actors load their models (one never finishes)", RAY, "hangs",
            lambda err: actors_loading, settle_s=1.0),
    Instant("ray-start-barrier", "the start barrier passes on Ray", RAY, "toy", started),
)


def wait_for(probe: Probe, pid: int, logs: Path, timeout_s: float = WAIT_FOR_INSTANT_S) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if probe(pid, logs):
            return True
        time.sleep(0.005)
    return False


def judge_stop(run: JobRun, struck: float | None, logs: Path, code: int, reason: str) -> tuple[bool, float | None, str]:
    """Whether a start-up trial ended as a stop must: its code, one line, no traceback, a whole log or none, all gone."""
    if struck is None:
        return False, None, "the instant was never seen"
    if run.returncode is None or run.exit_time is None:
        return False, None, f"no exit, or no report: {run.stderr.strip()[-300:]!r}"
    gone_s = None if run.gone_time is None else run.gone_time - struck
    problems = []
    if run.returncode != code:
        problems.append(f"exit {run.returncode}")
    said = [line for line in run.stderr.splitlines() if line.startswith(f"benchmark.py: {reason} (")]
    if len(said) != 1:
        problems.append(f"{len(said)} lines saying {reason}")
    if "Traceback" in run.stderr:
        problems.append("a traceback")
    if gone_s is None or gone_s > GONE_BOUND_S:
        problems.append(f"processes left {gone_s if gone_s is None else round(gone_s, 2)} s after the signal")
    for job in job_dirs(logs):
        meta = job / "meta.json"
        found = json.loads(meta.read_text()).get("termination_reason") if meta.exists() else "no meta.json"
        if found != reason:
            problems.append(f"{job.name}: {found}")
    return not problems, gone_s, ", ".join(problems) or f"ok ({'a log' if job_dirs(logs) else 'no log'})"


def strike_at(instant: Instant, stderr: Path, logs: Path, number: int) -> Callable[[int, int], float | None]:
    """The fault: wait for the instant, then the signal to the job's process group; when it struck (None: missed)."""
    def act(pid: int, group: int) -> float | None:
        if not wait_for(instant.probe(stderr), pid, logs):
            return None
        time.sleep(instant.settle_s)
        os.killpg(group, number)
        return time.time()
    return act
