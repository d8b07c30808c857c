"""The prepared GPU run: every GPU path of the harness checked on a real GPU, one line each, by one deadline.

    seam          the device seam's cost per item: CUDA events recorded around a call and read back (what the
                  runner does), next to a bare stream synchronise; a 50 ms spin read by the events and by the
                  host's clock around a synchronise (an error of scale in the events shows)
    uuid          torch's UUID of every GPU is NVML's under CUDA_DEVICE_ORDER=PCI_BUS_ID; a runner told another refuses
    pinned        a host slot page-locked in a GPU process: pinned, and a 64 MiB device-to-host copy returns
                  before it is done
    stage-times   a job of three 20 ms GPU spins (models.toy.GpuSpin): on every item and step, inside{k} >=
                  device_ms{k} >= half the spin, and the stages add up to end to end
    nvdec         a GPU loader with "require_nvdec": every item's decode_device is "nvdec", the warm-up is in the
                  notes and item 0 decodes no slower than 3x the median; NVML's decoder percentage shown
    nvdec-frames  NVDEC's frames against CPU decoding's: every value within 3 of 255 (torchcodec's own tolerance
                  for its CUDA 13 build), PSNR shown
    nvdec-overlap the loader decodes on NVDEC while the network fetches: clips fetched ahead through the WAN
                  profile (100 Mbit/s, 20 ms) reach 0.9 of the slower of the link and the same loader from local
                  disk, every item after the first fetched ahead and decoded on NVDEC
    fallback      32x32 H.264, under NVDEC's minimum width: without require_nvdec the items say "cpu-fallback" and
                  the notes say why; with it the job exits 1 with one sentence
    contexts      NVML's compute processes during two jobs: one per GPU runner, the main process only where it
                  holds CUDA slots, none for the client or for a CPU runner that reads a GPU step
    busy          a job started by a process that holds a CUDA context runs; next to a stranger's it exits 2
    ipc           three GPU jobs in one process: no "Producer process has been terminated" warning, nothing
                  reserved after any, the GPU's used memory not growing from one to the next
    dtype         R2P1DRunner in float16, bfloat16 and channels_last against float32: outputs close; items/s each
    tests         the GPU-marked pytest tests (they keep TESTS_S of the deadline for themselves)
    P8            R(2+1)D pipeline on one GPU through the harness / the same two calls in one loop (goal >= 0.95),
                  and P8d, the loader alone on the GPU / on the CPU (they keep P8_S, and run last)

One deadline bounds the whole run (--deadline, 300 s by default): every
wait is the smaller of its own bound and the time left, each child runs in
a session of its own and is killed with its process group when it runs
past, a step that finds too little time left is a SKIP line, and the JSON
is rewritten after every line, so a run stopped from outside still leaves
its results.

The GPU machine has its own torch (2.11, CUDA 13) but no torchcodec, no
FFmpeg libraries and no py3nvml, and reaches no package index:
bench/gpu_bundle.py says what is brought along and why. Once, where PyPI is
reachable, from the repository root:

    echo /.whl/ >> .git/info/exclude
    python -m bench.gpu_check --prepare          # downloads 42 MiB of wheels into .whl/

then call the device tool's `run` with carry [".whl"], timeout_s 420 and the command

    set -o pipefail; PYTHONUNBUFFERED=1 python3 -m bench.gpu_check 2>&1 | tee $OUT/gpu.log

It writes $OUT/gpu_check.json where OUT is set (or --json FILE). Finding
.whl/, the script unpacks it under /tmp and runs itself again with
PYTHONPATH and LD_LIBRARY_PATH pointing there (the jobs and pytest inherit
them). `--only seam,nvdec` runs some lines; `--skip-tests` leaves pytest out.

`--rehearse` runs the same orchestration on a machine without a GPU, with
stand-ins at its edges (bench/gpu_rehearsal.py): a run of under a minute
whose lines pass, fail, hang and are skipped on purpose.

Exit code: 0 when every line passed (a SKIP is not a pass), 1 otherwise, 2 without CUDA or for a wrong flag.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench import gpu_bundle, gpu_rehearsal
from bench.bounded import Deadline
from bench.gpu_kit import Check, Datasets, Plan, Step, one_line
from bench.gpu_suite import CHECKS, check_gpu_tests, check_p8

WHEEL_DIR = Path(".whl")
BUNDLED = "RNB_GPU_BUNDLE"  # set in the process that runs with the unpacked bundle
DEADLINE_S = 300.0          # the whole run, pytest and P8 included
TESTS_S = 60.0              # what the GPU tests keep for themselves of the deadline
P8_S = 90.0                 # what P8 keeps, after the tests
MIN_START_S = 10.0          # a step with less than this left is not started (SKIP)


GPU_PLAN = Plan("bench/gpu_check.py", (*(Step(name, check) for name, check in CHECKS.items()),
                                       Step("tests", check_gpu_tests, TESTS_S), Step("P8", check_p8, P8_S)),
                DEADLINE_S, MIN_START_S)


class Report:
    """gpu_check.json, rewritten whole after every line (through a rename: a reader never sees half a file)."""

    def __init__(self, path: Path | None, header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self.checks: list[Check] = []

    def add(self, check: Check) -> None:
        self.checks.append(check)
        self.write(finished=False)

    def write(self, finished: bool, **closing: Any) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({**self.header, "finished": finished, **closing,
                                       "checks": [asdict(check) for check in self.checks]}, indent=2, default=str))
        os.replace(partial, self.path)


def run_plan(plan: Plan, deadline: Deadline, report: Report) -> None:
    """Every step in order, each within the deadline less what the steps after it keep; each line printed."""
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        datasets = Datasets(Path(tmp) / "data")
        for index, step in enumerate(plan.steps):
            mine = deadline.before(sum(later.kept_s for later in plan.steps[index + 1:]))
            left = mine.left()
            started = time.monotonic()
            if left < plan.min_start_s:
                check = Check(step.name, "SKIP", f"not started: {left:.1f} s left of its share of the deadline, "
                                                 f"under the {plan.min_start_s:g} s a step needs")
            else:
                try:
                    check = step.run(datasets, Path(tmp) / step.name, mine)
                except Exception as error:  # one step's failure is its line; the others still run
                    check = Check(step.name, "FAIL", one_line(error))
            check = replace(check, seconds=round(time.monotonic() - started, 3))
            report.add(check)
            print(check.line(), flush=True)


def machine_words() -> dict[str, Any]:
    """torch, the GPU as NVML names it, and the kernel and runtime under them (gVisor's kernel says 4.4.0)."""
    import torch

    from rnb.pipeline.gpus import Nvml

    try:
        with Nvml() as nvml:
            gpu = nvml.device(0).name
    except Exception as error:  # no py3nvml (the bundle did not install), no driver: the checks say the rest
        gpu = f"a GPU NVML cannot name ({one_line(error)})"
    release = platform.release()
    runtime = "gVisor" if release == "4.4.0" else "Firecracker" if "-fc-" in release else "not known"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu, "kernel": release, "runtime": runtime}


def run(plan: Plan, deadline_s: float, target: Path | None) -> int:
    """The plan's steps by one deadline: a header line, a line per step, a closing line; the exit code."""
    words = machine_words()
    print(f"{plan.title}: torch {words['torch']} (CUDA {words['cuda']}) on {words['gpu']}; kernel {words['kernel']} "
          f"(runtime {words['runtime']}); deadline {deadline_s:g} s; {len(plan.steps)} steps", flush=True)
    report = Report(target, {"started": time.time(), "deadline_s": deadline_s, **words})
    started = time.monotonic()
    run_plan(plan, Deadline.after(deadline_s), report)
    seconds = time.monotonic() - started
    counts = {status: sum(check.status == status for check in report.checks) for status in ("PASS", "FAIL", "SKIP")}
    code = 0 if report.checks and counts["PASS"] == len(report.checks) else 1  # a run of no step tested nothing
    report.write(finished=True, seconds=seconds, exit_code=code)
    print(f"{plan.title}: {counts['PASS']}/{len(report.checks)} passed, {counts['FAIL']} failed, {counts['SKIP']} "
          f"skipped in {seconds:.0f} s; exit code {code}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here (default: $OUT/gpu_check.json if OUT is set)")
    parser.add_argument("--only", help=f"comma-separated steps to run ({', '.join(step.name for step in GPU_PLAN.steps)})")
    parser.add_argument("--skip-tests", action="store_true", help="leave the GPU pytest tests out")
    parser.add_argument("--deadline", type=float, metavar="SECONDS",
                        help=f"the whole run's deadline (default {DEADLINE_S:g} s; rehearsed: "
                             f"{gpu_rehearsal.DEADLINE_S:g} s)")
    parser.add_argument("--prepare", action="store_true", help=f"download the wheels to carry into {WHEEL_DIR}/ and exit")
    parser.add_argument("--rehearse", action="store_true",
                        help="run the orchestration on the CPU with stand-ins (bench/gpu_rehearsal.py)")
    args = parser.parse_args(argv)
    if args.prepare:
        total = gpu_bundle.prepare(WHEEL_DIR)
        print(f"bench/gpu_check.py: {WHEEL_DIR}/ holds {total / 2**20:.1f} MiB of wheels to carry", flush=True)
        return 0
    plan = gpu_rehearsal.plan() if args.rehearse else GPU_PLAN
    names = [step.name for step in plan.steps]
    only = [name.strip() for name in args.only.split(",")] if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown or (args.deadline is not None and not args.deadline > 0):  # NaN is not > 0 either
        what = (f"--only: expected names among {', '.join(names)}, found {', '.join(unknown)}" if unknown else
                f"--deadline: expected a number of seconds > 0, found {args.deadline:g}")
        print(f"bench/gpu_check.py: {what}", file=sys.stderr)
        return 2
    plan = plan.only([name for name in only if not (args.skip_tests and name == "tests")])
    target = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    if args.rehearse:
        gpu_rehearsal.use_stand_in_nvml()
        return run(plan, args.deadline or plan.deadline_s, target)
    if WHEEL_DIR.is_dir() and BUNDLED not in os.environ:
        return run_bundled(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():  # asks the driver how many GPUs there are; creates no context
        print("bench/gpu_check.py: torch sees no CUDA device; run this on a GPU machine", file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return run(plan, args.deadline or plan.deadline_s, target)


def run_bundled(argv: list[str]) -> int:
    """This script again, with the carried wheels unpacked and the environment pointing at them."""
    try:
        env, libpython = gpu_bundle.install(WHEEL_DIR, Path(tempfile.gettempdir()) / "rnb-gpu-bundle")
    except Exception as error:  # the run goes on without the bundle: the checks that need it fail, the rest run
        print(f"bench/gpu_check.py: the bundle in {WHEEL_DIR}/ did not install ({one_line(error)}); running without "
              "it", flush=True)
        env, libpython = {}, ""
    if libpython:
        print(f"bench/gpu_check.py: {libpython}", flush=True)
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", *argv], env={**os.environ, **env, BUNDLED: "1"}).returncode


if __name__ == "__main__":
    sys.exit(main())
