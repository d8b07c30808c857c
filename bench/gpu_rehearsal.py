"""The GPU run rehearsed on a machine without one: bench/gpu_check.py's orchestration, stand-ins at its edges.

The first GPU run is short, and a mistake in how it is run (a child that
outlives its time, a result written only at the end, a failure that takes
the other lines with it) would cost all of it. `--rehearse` runs the same
plan machinery, deadline, process handling, report and exit code, with
these steps in place of the GPU checks:

    seam       the seam check itself, on models.toy's SleepingDevice (AsyncSleep's device) in place of a CUDA
               stream: PASS
    dies       an isolated call whose process exits 3 before it answers: FAIL, with its exit code
    hangs      a child that starts a grandchild and never ends: killed with both at the checks' deadline, FAIL
    unreached  a check left no time by the hang: SKIP
    tests      pytest over a stand-in file of one passing and one skipped test: PASS
    P8         a P8 that crashes: FAIL

so it exits 1. NVML is a stand-in too (one described GPU), swapped in at
rnb.pipeline.gpus.Nvml as the tests swap it.
"""
from __future__ import annotations

import functools
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from bench.bounded import Deadline, finish, first_line, isolated, start
from bench.gpu_device_checks import check_seam
from bench.gpu_kit import ISOLATED_S, Check, Datasets, Plan, Step, verdict
from bench.gpu_suite import run_pytest

if TYPE_CHECKING:  # both import torch, which the rehearsal's own processes do without
    from rnb.core.device import DeviceMark
    from rnb.pipeline.gpus import DeviceState

DEADLINE_S = 40.0
TESTS_S = 15.0
P8_S = 2.0
MARK = "rnb-rehearsal-hang-"  # and the rehearsing process's pid: in the hung processes' command lines
HANGS = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", sys.argv[1]])
    print(f"started {grandchild.pid}", flush=True)
    time.sleep(3600)
""")
STAND_IN_TESTS = textwrap.dedent("""
    import pytest

    def test_passes():
        assert sum(range(4)) == 6

    @pytest.mark.skip(reason="skipped on purpose")
    def test_skipped():
        pass
""")


class SleepSpinner:
    """AsyncSleep's device (models.toy.SleepingDevice) as the seam check's device: a spin is work booked on its clock.

    Waiting on its marks is a sleep, which a loaded CPU ends late: hence the
    looser bounds, which still catch an error of scale (a mark read in
    seconds or in µs).
    """

    events_bound_us = 2000.0
    spin_tolerance = 0.75

    def __init__(self) -> None:
        from models.toy import SleepingDevice  # here, in the isolated process: the rehearsal's own imports no torch

        self.device = SleepingDevice()

    def mark(self) -> DeviceMark:
        return self.device.mark()

    def spin(self, ms: float) -> None:
        self.device.submit(ms / 1000, lambda: None)

    def synchronize(self) -> None:
        self.device.mark().wait()


def dies() -> None:
    os._exit(3)


def check_dies(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    isolated(dies, deadline=deadline, own_s=ISOLATED_S)
    return verdict("dies", False, "the process answered instead of dying")


def hang_mark() -> str:
    return f"{MARK}{os.getpid()}"


def check_hangs(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    child = start([sys.executable, "-c", HANGS, hang_mark()])
    started = first_line(child, deadline, ISOLATED_S, "the hanging stand-in")
    finish(child, deadline, 3600.0, f"the hanging stand-in (and its grandchild, {started.strip()})")
    return verdict("hangs", False, "the hanging stand-in ended by itself")


def check_stand_in_tests(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    work.mkdir(parents=True, exist_ok=True)
    (work / "pytest.ini").write_text("[pytest]\n")  # this folder is pytest's root: no conftest of the project
    (work / "test_stand_in.py").write_text(STAND_IN_TESTS)
    return run_pytest(["-c", str(work / "pytest.ini"), "--rootdir", str(work), str(work / "test_stand_in.py")],
                      deadline)


def check_crashing_p8(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    raise RuntimeError("the P8 stand-in crashed on purpose, as P8 does when a job of it fails")


def plan() -> Plan:
    seam = functools.partial(check_seam, SleepSpinner)
    return Plan("bench/gpu_check.py --rehearse (CPU stand-ins, no GPU)",
                (Step("seam", seam), Step("dies", check_dies), Step("hangs", check_hangs), Step("unreached", seam),
                 Step("tests", check_stand_in_tests, TESTS_S), Step("P8", check_crashing_p8, P8_S)),
                DEADLINE_S, 1.0)


class StandInNvml:
    """rnb.pipeline.gpus.Nvml for the rehearsal: one GPU, described, with no compute process on it."""

    def __enter__(self) -> StandInNvml:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def device_count(self) -> int:
        return 1

    def device(self, physical_index: int) -> DeviceState:
        from rnb.pipeline.gpus import DeviceState

        return DeviceState("stand-in GPU (fake NVML)", "GPU-00000000-0000-0000-0000-000000000000", 80 * 2**30, 0, ())


def use_stand_in_nvml() -> None:
    """Swap NVML for the stand-in in this process, at the seam the tests use (its children keep the real one)."""
    from rnb.pipeline import gpus

    vars(gpus)["Nvml"] = StandInNvml
