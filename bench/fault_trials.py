"""A row of bench/faults.py and what its trials share: the toy configs, waiting for a job's start, judging how
a job ended, the table."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.fault_inputs import TOY
from bench.fault_jobs import (
    HANG_S,
    JobRun,
    waiting_for_fork_server,
)

REPO = Path(__file__).resolve().parents[1]

@dataclass
class FaultRow:
    """One kind of fault: how many trials ended as they must, and the worst of what the others left."""

    id: str
    what: str
    trials: int = 0
    passes: int = 0
    worst_exit_s: float = 0.0
    orphans: int = 0
    leftovers: int | None = 0
    lost: int | None = None   # items the final step counted that the log lacks, over the trials; None: not known
    worst_end_s: float | None = None   # a hang row's longest time from the hang to the job's end (its flag)
    failures: list[str] = field(default_factory=list)

    def add(self, passed: bool, exit_s: float | None, note: str = "", orphans: int = 0,
            leftovers: int | None = None, lost: int | None = None, end_s: float | None = None) -> None:
        self.trials += 1
        self.passes += passed
        self.worst_exit_s = max(self.worst_exit_s, exit_s or 0.0)
        if end_s is not None:
            self.worst_end_s = max(self.worst_end_s or 0.0, end_s)
        self.orphans += orphans
        self.leftovers = None if leftovers is None or self.leftovers is None else self.leftovers + leftovers
        if lost is not None:
            self.lost = (self.lost or 0) + lost
        if not passed:
            self.failures.append(note)


def toy(**step_changes: dict) -> dict:
    document = copy.deepcopy(TOY)
    for k, changes in step_changes.items():
        document["pipeline"][int(k[-1])].update(changes)
    return document


def holding(hold: str) -> dict:
    return {"source": {"synthetic": True}, "pipeline": [
        {"model": "bench.fault_models.DiesHolding", "queue_groups": [{"gpus": [-1, -1]}], "hold": hold, "at_item": 3}]}


def after_start(work: Path, delay_s: float = 1.0, timeout_s: float = 120.0) -> None:
    """Wait until the job announces its start barrier, then `delay_s` more (some items finish)."""
    deadline = time.time() + timeout_s
    while "started" not in (work / "stderr").read_text() and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(delay_s)


def during_start_up(pid: int, logs: Path, timeout_s: float = 120.0) -> None:
    """Wait until the main process is at its first child, waiting for its fork server to import torch."""
    deadline = time.time() + timeout_s
    while not waiting_for_fork_server(pid, logs) and time.time() < deadline:
        time.sleep(0.01)

def judge(run: JobRun, struck: float | None, code: int, reason: str | None) -> tuple[bool, float | None, str]:
    """Whether a job trial ended as it must; the time from fault to exit; what went wrong."""
    if run.returncode is None or run.exit_time is None:  # the report's last line carries both, or neither
        return False, None, f"no exit within {HANG_S:g} s, or no report: {run.stderr.strip()[-300:]!r}"
    if reason is None:  # the main process was killed: its children must go at once, its log stays incomplete
        exit_s = None if run.gone_time is None or struck is None else run.gone_time - struck
        ok = exit_s is not None and exit_s < 2.0 and run.meta is None
        return ok, exit_s, f"children gone after {exit_s} s; meta.json {'written' if run.meta else 'absent'}"
    meta = run.meta or {}
    exit_s = run.exit_time - (struck if struck is not None else meta.get("end_time", run.exit_time))
    problems = []
    if run.returncode != code:
        problems.append(f"exit {run.returncode}")
    if meta.get("termination_reason") != reason:
        problems.append(f"reason {meta.get('termination_reason')!r}")
    if "Traceback" in run.stderr:
        problems.append("a traceback")
    return not problems, exit_s, ", ".join(problems)

def table(rows: list[FaultRow], header: bool = True) -> str:
    lines = ["| id | what | trials | passes | worst end s | worst exit s | lost items | orphans | leftover shm |",
             "|---|---|---|---|---|---|---|---|---|"] if header else []
    for r in rows:
        left = "n/a" if r.leftovers is None else str(r.leftovers)
        lost = "-" if r.lost is None else str(r.lost)
        end = "-" if r.worst_end_s is None else f"{r.worst_end_s:.2f}"
        lines.append(f"| {r.id} | {r.what} | {r.trials} | {r.passes} | {end} | {r.worst_exit_s:.2f} | {lost} | "
                     f"{r.orphans} | {left} |")
    return "\n".join(lines)


def ensure_dataset(work: Path) -> Path:
    from episodes.synthetic import SyntheticSpec, make_dataset

    root = work / "dataset"
    if not root.exists():
        make_dataset(root, SyntheticSpec(codec="h264", gop=4, episodes=4, cameras=1, episodes_per_file=2,
                                         min_length=8, max_length=12, width=32, height=32, seed=1))
    return root
