"""`python -m bench.gpu_check --rehearse`: the GPU run's whole orchestration on the CPU, stand-ins at its edges.

One rehearsal runs for the module, as a user would start it; each test
reads one property of it: its lines, its JSON after every line, the hung
step killed at the deadline with every process it started, the exit code.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import gpu_rehearsal

pytestmark = pytest.mark.slow  # one rehearsal of about a minute for the module

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 50.0  # the checks get 50 - 15 - 2 = 33 s: the seam's process imports torch, slowly on a loaded machine
CHECKS_END_S = DEADLINE_S - gpu_rehearsal.TESTS_S - gpu_rehearsal.P8_S
TITLE = "bench/gpu_check.py --rehearse (CPU stand-ins, no GPU)"


@dataclass(frozen=True)
class Rehearsal:
    pid: int
    code: int
    lines: list[str]
    snapshots: list[dict[str, Any]]  # the JSON as it was each time a step's line appeared
    report: dict[str, Any]
    stderr: str

    def step(self, name: str) -> dict[str, Any]:
        return next(check for check in self.report["checks"] if check["name"] == name)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Rehearsal:
    target = tmp_path_factory.mktemp("rehearsal") / "gpu_check.json"
    child = subprocess.Popen([sys.executable, "-m", "bench.gpu_check", "--rehearse", "--deadline", f"{DEADLINE_S:g}",
                              "--json", str(target)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert child.stdout is not None and child.stderr is not None
    lines, snapshots = [], []
    for line in child.stdout:
        lines.append(line.rstrip("\n"))
        if re.match(r"(PASS|FAIL|SKIP) ", line):
            snapshots.append(json.loads(target.read_text()))
    stderr = child.stderr.read()
    code = child.wait()
    return Rehearsal(child.pid, code, lines, snapshots, json.loads(target.read_text()), stderr)


def test_every_step_prints_its_line_and_the_run_closes_with_its_count_and_exit_code(rehearsal: Rehearsal) -> None:
    assert rehearsal.code == 1, rehearsal.stderr
    header, *rest, closing = rehearsal.lines
    assert header.startswith(f"{TITLE}: torch ") and f"on stand-in GPU (fake NVML); kernel {os.uname().release}" in header
    assert header.endswith(f"; deadline {DEADLINE_S:g} s; 6 steps")
    steps = [line for line in rest if re.match(r"(PASS|FAIL|SKIP) ", line)]
    assert [line[:19] for line in steps] == ["PASS  seam         ", "FAIL  dies         ", "FAIL  hangs        ",
                                             "SKIP  unreached    ", "PASS  tests        ", "FAIL  P8           "]
    assert steps[1] == "FAIL  dies          RuntimeError: dies's process ended with exit code 3 before it answered"
    assert steps[3] == ("SKIP  unreached     not started: 0.0 s left of its share of the deadline, under the 1 s a "
                        "step needs")
    assert steps[4].startswith("PASS  tests         exit 0: 1 passed, 1 skipped in ")
    assert steps[5] == ("FAIL  P8            RuntimeError: the P8 stand-in crashed on purpose, as P8 does when a job "
                        "of it fails")
    assert rest[rest.index(steps[4]) - 1].startswith("1 passed, 1 skipped in ")  # pytest's own last line, printed
    assert re.fullmatch(rf"{re.escape(TITLE)}: 2/6 passed, 3 failed, 1 skipped in \d+ s; exit code 1", closing)


def test_the_seam_check_reads_a_spin_on_the_stand_in_device(rehearsal: Rehearsal) -> None:
    seen = rehearsal.step("seam")["seen"]
    assert seen["spin_host_ms"] >= 50.0 and seen["spin_device_ms"] > 0
    assert seen["events_bound_us"] == gpu_rehearsal.SleepSpinner.events_bound_us


def test_the_json_is_rewritten_after_every_line_and_closed_at_the_end(rehearsal: Rehearsal) -> None:
    names = ["seam", "dies", "hangs", "unreached", "tests", "P8"]
    written = [[check["name"] for check in snapshot["checks"]] for snapshot in rehearsal.snapshots]
    assert [seen[: n + 1] for n, seen in enumerate(written)] == [names[: n + 1] for n in range(6)]
    assert written[1] == ["seam", "dies"]  # read while the hang ran: nothing after it could have been written yet
    assert [snapshot["finished"] for snapshot in rehearsal.snapshots[:5]] == [False] * 5
    report = rehearsal.report
    assert (report["finished"], report["exit_code"], report["deadline_s"]) == (True, 1, DEADLINE_S)
    assert [check["status"] for check in report["checks"]] == ["PASS", "FAIL", "FAIL", "SKIP", "PASS", "FAIL"]
    assert report["gpu"] == "stand-in GPU (fake NVML)" and report["seconds"] < DEADLINE_S


def test_the_hung_step_is_killed_at_the_deadline_with_every_process_it_started(rehearsal: Rehearsal) -> None:
    hangs = rehearsal.step("hangs")
    match = re.fullmatch(r"Overrun: the hanging stand-in \(and its grandchild, started (\d+)\) ran past the deadline "
                         r"\(([\d.]+) s away when the wait began\): killed with its process group \(pids (\d+), (\d+)\)",
                         hangs["figure"])
    assert match, hangs["figure"]
    grandchild, away, *killed = match.groups()
    assert killed[1] == grandchild
    # It waited all that was left until the checks' deadline, and no longer.  The steps' seconds place that deadline
    # only roughly: on a loaded host the moments between steps (a line printed, the JSON written) took 1.4 s once.
    assert hangs["seconds"] >= float(away) - 0.1
    waited = sum(rehearsal.step(name)["seconds"] for name in ("seam", "dies", "hangs"))
    assert CHECKS_END_S - 3.0 <= waited < CHECKS_END_S + 5.0
    mark = f"{gpu_rehearsal.MARK}{rehearsal.pid}"
    left = [process.pid for process in psutil.process_iter(["cmdline", "status"])
            if mark in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE]
    assert left == []
