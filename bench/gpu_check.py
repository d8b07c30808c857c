"""The prepared GPU run: every GPU path of the harness checked on a real GPU, one line each (< 5 minutes on one GPU).

    seam          the device seam's cost per item: CUDA events recorded around a call and read back (what the
                  runner does), next to a bare stream synchronise; a 1 ms spin read back by the events
    stage-times   a job of three 20 ms GPU spins (models.toy.GpuSpin): on every item and step, inside{k} >=
                  device_ms{k} >= the spin, and the stages add up to end to end
    nvdec         a GPU loader with "require_nvdec": every item's decode_device is "nvdec", NVML saw NVDEC busy,
                  the warm-up is in the notes and item 0 decodes no slower than the rest
    nvdec-frames  NVDEC's frames against CPU decoding's: every value within 3 of 255 (torchcodec's own tolerance
                  for its CUDA 13 build), PSNR shown
    fallback      32x32 H.264, under NVDEC's minimum width: without require_nvdec the items say "cpu-fallback" and
                  the notes say why; with it the job exits 1 with one sentence
    ipc           three GPU jobs in one process: no "Producer process has been terminated" warning, nothing
                  reserved after any, the GPU's used memory not growing from one to the next
    contexts      NVML's compute processes during two jobs: one per GPU runner, the main process only where it
                  holds CUDA slots, none for the client or for a CPU runner that reads a GPU step
    busy          a job started by a process that holds a CUDA context runs; next to a stranger's it exits 2
    uuid          torch's UUID of every GPU is NVML's under CUDA_DEVICE_ORDER=PCI_BUS_ID; a runner told another refuses
    pinned        a host slot page-locked in a GPU process: pinned, and a 64 MiB device-to-host copy returns
                  before it is done
    dtype         R2P1DRunner in float16, bfloat16 and channels_last against float32: outputs close; items/s each
    P8, P8d       R(2+1)D pipeline on one GPU through the harness / the same two calls in one loop (goal >= 0.95);
                  the loader alone on the GPU / on the CPU
    tests         the GPU-marked pytest tests

Each check runs its GPU work in processes of its own (jobs through
benchmark.py, the rest in a spawned process), so this process never holds a
CUDA context: NVML's view of the GPU is the jobs' alone.

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
them). `--only seam,nvdec` runs some checks; `--skip-tests` leaves pytest out.

Exit code: 0 when every check passed (SKIP counts as passed), 1 otherwise, 2 without CUDA.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from bench import gpu_bundle
from bench.common import Effort, Goal, Row, table_text
from bench.harness_bench import chain_pipeline, harness_pair, loop_throughput
from rnb.core.timecard import TimeCard

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = Path(".whl")
BUNDLED = "RNB_GPU_BUNDLE"  # set in the process that runs with the unpacked bundle
BUDGET_S = 290.0            # the whole run, pytest included, stays under 5 minutes
SPIN_MS = 20.0
FRAME_TOLERANCE = 3         # torchcodec's test tolerance for CUDA frames against CPU frames (CUDA 13 builds)
IPC_WARNING = "Producer process has been terminated before all shared CUDA tensors released"
LOADER = ("models.episode.EpisodeLoader", {"num_clips": 4, "clip_length": 8, "size": 112})
NETWORK = ("models.r2p1d.R2P1DRunner", {"start_index": 1, "end_index": 5, "num_clips": 4, "clip_length": 8,
                                        "size": 112})
DISCARD: tuple[str, dict[str, Any]] = ("bench.harness_bench.Discard", {})
TOY = {"clips": 2, "frames": 4, "height": 16, "width": 16}


@dataclass(frozen=True)
class Check:
    """One line of the run: a check's name, PASS/FAIL/SKIP, its figure, and what it saw (for the JSON)."""

    name: str
    status: str
    figure: str
    seen: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<13} {self.figure}"


def verdict(name: str, ok: bool, figure: str, **seen: Any) -> Check:
    return Check(name, "PASS" if ok else "FAIL", figure, seen)


@dataclass(frozen=True)
class Job:
    """What one benchmark.py run left: its exit code, stderr, log, and the GPU processes NVML saw meanwhile."""

    code: int
    pid: int                          # the job's main process
    stderr: str
    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    job_dir: Path | None
    gpu_pids: frozenset[int] = frozenset()

    def pids(self) -> dict[str, int]:
        """Every process of the job by name, the main process as "main"."""
        return {"main": self.pid, **{p["name"]: p["pid"] for p in self.meta.get("processes", []) if p["pid"]}}

    def column(self, name: str) -> list[Any]:
        return [row.get(name) for row in self.rows]


class Datasets:
    """The synthetic datasets the checks read, made once: 256x256 H.264 (NVDEC decodes it) and 32x32 (it cannot)."""

    def __init__(self, root: Path) -> None:
        from episodes.testing.synthetic import make_dataset

        self.good = make_dataset(root / "good", episodes=8, cameras=1, episodes_per_file=4, width=256, height=256,
                                 min_length=30, max_length=60)
        self.tiny = make_dataset(root / "tiny", episodes=2, cameras=1, episodes_per_file=2, width=32, height=32,
                                 min_length=12, max_length=16)


def pipeline(steps: Sequence[tuple[str, dict[str, Any], int]], source: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config of one runner per step, (model, keywords, gpu) each."""
    config = chain_pipeline(tuple((model, kwargs) for model, kwargs, _ in steps), 0)
    for step, (_, _, gpu) in zip(config["pipeline"], steps):
        step["queue_groups"][0]["gpus"] = [gpu]
    if source is not None:
        config["source"] = source
    return config


def run_job(config: dict[str, Any], items: int, work: Path, extra: Sequence[str] = (),
            env: dict[str, str] | None = None, watch_gpu: bool = False) -> Job:
    """benchmark.py over `config` in a process of its own (bulk, `items`), optionally watching NVML's GPU processes."""
    from rnb.pipeline.gpus import child_environment

    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.json"
    path.write_text(json.dumps(config))
    logs = Path(tempfile.mkdtemp(dir=work, prefix="logs-"))
    command = [sys.executable, str(REPO / "benchmark.py"), "-c", str(path), "-mi", "0", "-v", str(items),
               "--warmup", "0", "--log-dir", str(logs), *extra]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env or child_environment())
    seen: set[int] = set()
    ended = threading.Event()
    watcher = threading.Thread(target=_watch_gpu, args=(ended, seen), daemon=True) if watch_gpu else None
    if watcher is not None:
        watcher.start()
    try:
        _, stderr = child.communicate(timeout=240)
    finally:
        ended.set()
    if watcher is not None:
        watcher.join()
    jobs = list(logs.iterdir())
    meta = json.loads((jobs[0] / "meta.json").read_text()) if jobs else {}
    rows = pq.read_table(jobs[0] / "timings.parquet").to_pylist() if jobs and (jobs[0] / "timings.parquet").exists() else []
    return Job(child.returncode, child.pid, stderr, meta, rows, jobs[0] if jobs else None, frozenset(seen))


def _watch_gpu(ended: threading.Event, seen: set[int]) -> None:
    """Every compute process NVML lists on GPU 0 until `ended` is set."""
    from rnb.pipeline.gpus import Nvml

    with Nvml() as nvml:
        while not ended.wait(0.02):
            seen.update(nvml.device(0).compute_pids)


def isolated(function: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> Any:
    """`function(*args)` in a spawned process of its own (a fresh CUDA context, gone with it); its result."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_isolated_main, args=(send, function, args), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise TimeoutError(f"{function.__name__} did not finish within {timeout_s:.0f} s")
        ok, value = receive.recv()
    finally:
        process.kill()
        process.join()
    if not ok:
        raise RuntimeError(value)
    return value


def _isolated_main(send: Any, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        send.send((True, function(*args)))
    except BaseException as error:  # the parent learns any failure as one line
        send.send((False, f"{type(error).__name__}: {error}"))


# ---------------------------------------------------------------- the checks

def seam_costs(items: int = 2000) -> dict[str, float]:
    """µs per item of the runner's seam (two CUDA events, a synchronise, elapsed time) and of a bare synchronise."""
    from rnb.core.device import CudaQueue

    stream = torch.cuda.Stream()
    queue = CudaQueue(stream)

    def per_item(work: Callable[[], None]) -> float:
        started = time.perf_counter()
        for _ in range(items):
            work()
        return (time.perf_counter() - started) / items * 1e6

    def events() -> None:
        began = queue.mark()
        done = queue.mark()
        done.wait()
        done.ms_since(began)
    per_item(events)
    cycles = 10_000_000
    with torch.cuda.stream(stream):
        began = queue.mark()
        torch.cuda._sleep(cycles)
        done = queue.mark()
        done.wait()
        long_ms = done.ms_since(began)
        began = queue.mark()
        torch.cuda._sleep(int(cycles / long_ms))  # 1 ms at the rate just measured
        done = queue.mark()
        done.wait()
    return {"events_us": per_item(events), "synchronize_us": per_item(stream.synchronize),
            "spin_1ms_read_ms": done.ms_since(began)}


def check_seam(datasets: Datasets, work: Path) -> Check:
    costs = isolated(seam_costs)
    ok = costs["events_us"] < 100 and 0.8 <= costs["spin_1ms_read_ms"] <= 1.25
    return verdict("seam", ok, f"events {costs['events_us']:.1f} us/item, bare synchronise "
                               f"{costs['synchronize_us']:.1f} us/item (empty items); a 1 ms spin read back as "
                               f"{costs['spin_1ms_read_ms']:.3f} ms", **costs)


def check_stage_times(datasets: Datasets, work: Path) -> Check:
    from rnb.core.stages import END_TO_END, part_latencies

    spin = ("models.toy.GpuSpin", {"ms": SPIN_MS, **TOY})
    job = run_job(pipeline([(*spin, 0), (*spin, 0), (*spin, 0)]), 40, work / "stages")
    if job.code != 0 or job.job_dir is None:
        return verdict("stage-times", False, f"the job exited {job.code}: {job.stderr.strip()[-300:]}")
    short, slow = [], []
    for row in job.rows:
        for k in range(3):
            inside = (row[f"inference{k}_finish"] - row[f"inference{k}_start"]) * 1000
            device = row.get(f"device_ms{k}")
            if device is None or inside < device - 0.2:
                short.append((row["item_id"], k, inside, device))
            elif device < SPIN_MS / 2:  # the spin's cycles were counted at load; clocks may rise since
                slow.append((row["item_id"], k, device))
    parts = part_latencies(pq.read_table(job.job_dir / "timings.parquet"), 3)
    total = sum(values for key, values in parts.items() if key != END_TO_END.key)
    adds_up = bool(abs(total - parts[END_TO_END.key]).max() < 1e-6)
    device = sorted(row["device_ms1"] for row in job.rows)
    inside = sorted((row["inference1_finish"] - row["inference1_start"]) * 1000 for row in job.rows)
    ok = not short and not slow and adds_up and len(job.rows) == 40
    return verdict("stage-times", ok, f"{3 * len(job.rows) - len(short)}/{3 * len(job.rows)} item-steps inside >= "
                                      f"device_ms; step 1 median device_ms {device[len(device) // 2]:.2f} ms, inside "
                                      f"{inside[len(inside) // 2]:.2f} ms ({SPIN_MS:g} ms spins); stages add up: "
                                      f"{adds_up}", short=short[:5], slow=slow[:5])


def check_nvdec(datasets: Datasets, work: Path) -> Check:
    loader = (LOADER[0], {**LOADER[1], "require_nvdec": True})
    job = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], {"dataset": str(datasets.good)}), 80, work / "nvdec",
                  ["--sample-interval-ms", "50"])
    if job.code != 0 or job.job_dir is None:
        return verdict("nvdec", False, f"the job exited {job.code}: {job.meta.get('error') or job.stderr[-300:]}")
    devices = set(job.column("decode_device"))
    notes = job.meta.get("notes", [])
    decode_ms = [(row["decode_finish"] - row["decode_start"]) * 1000 for row in job.rows]
    median = sorted(decode_ms)[len(decode_ms) // 2]
    samples = pq.read_table(job.job_dir / "samples.parquet").column("nvdec_util_percent").to_pylist()
    busiest = max((value for value in samples if value is not None), default=0)
    warmed = any("warm-up decoded one frame" in note for note in notes)
    said = any("frames decode on NVDEC" in note for note in notes)
    ok = devices == {"nvdec"} and busiest > 0 and warmed and said and decode_ms[0] <= 3 * median
    return verdict("nvdec", ok, f"decode_device {sorted(devices)}; NVML decoder busy up to {busiest}%; item 0 "
                                f"decoded in {decode_ms[0]:.1f} ms, median {median:.1f} ms; warm-up noted: {warmed}",
                   notes=notes)


def compare_frames(root: str) -> dict[str, float]:
    """Frames of three instants of each episode decoded on NVDEC and on the CPU: the largest and mean differences."""
    from episodes import EpisodeByteCache, FrameRequest, open_dataset

    ds = open_dataset(root)
    key = ds.video_keys[0]
    worst, total, count, psnr = 0.0, 0.0, 0, math.inf
    with EpisodeByteCache(ds) as cache:
        for episode in range(ds.num_episodes):
            n = ds.episode_length(episode)
            asked = [FrameRequest(episode, key, frame_numbers=[0, n // 2, n - 1])]
            gpu = cache.read_frames(asked, device="cuda:0")[0]
            cpu = cache.read_frames(asked)[0].frames
            if gpu.backend.device != "nvdec":
                raise RuntimeError(f"episode {episode} decoded as {gpu.backend}")
            difference = (gpu.frames.cpu().float() - cpu.float()).abs()
            worst, total, count = max(worst, float(difference.max())), total + float(difference.sum()), count + difference.numel()
            mse = float((difference ** 2).mean())
            psnr = min(psnr, math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse))
    return {"max_abs": worst, "mean_abs": total / count, "min_psnr_db": psnr}


def check_nvdec_frames(datasets: Datasets, work: Path) -> Check:
    found = isolated(compare_frames, str(datasets.good))
    return verdict("nvdec-frames", found["max_abs"] <= FRAME_TOLERANCE,
                   f"NVDEC vs CPU: max |difference| {found['max_abs']:.0f} (tolerance {FRAME_TOLERANCE}), mean "
                   f"{found['mean_abs']:.3f}, lowest PSNR {found['min_psnr_db']:.1f} dB", **found)


def check_fallback(datasets: Datasets, work: Path) -> Check:
    source = {"dataset": str(datasets.tiny)}
    loader = (LOADER[0], {**LOADER[1], "num_clips": 1, "clip_length": 4, "size": 32})
    quiet = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], source), 4, work / "fallback")
    strict = run_job(pipeline([(loader[0], {**loader[1], "require_nvdec": True}, 0), (*DISCARD, 0)], source), 4,
                     work / "fallback-required")
    said = [note for note in quiet.meta.get("notes", []) if "on the CPU instead of NVDEC" in note]
    error = strict.meta.get("error") or ""
    ok = (quiet.code == 0 and set(quiet.column("decode_device")) == {"cpu-fallback"} and bool(said)
          and strict.code == 1 and "require_nvdec is set, but torchcodec decodes" in error and "\n" not in error)
    return verdict("fallback", ok, f"without require_nvdec: exit {quiet.code}, decode_device "
                                   f"{sorted(set(map(str, quiet.column('decode_device'))))}; with it: exit "
                                   f"{strict.code}: {error[:160]}", note=said[:1], error=error)


TWO_JOBS = textwrap.dedent("""
    import json, sys
    import torch
    from rnb import cli
    from rnb.pipeline.gpus import Nvml
    runs = []
    for n in range(3):
        code = cli.main(["-c", sys.argv[1], "-v", "20", "-mi", "0", "--log-dir", sys.argv[2]])
        with Nvml() as nvml:
            used = nvml.device(0).memory_used_bytes
        runs.append([code, [torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())], used])
    print(json.dumps(runs))
""")


def check_ipc(datasets: Datasets, work: Path) -> Check:
    from rnb.pipeline.gpus import Nvml, child_environment

    work.mkdir(parents=True, exist_ok=True)
    config = work / "ipc.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    with Nvml() as nvml:
        before = nvml.device(0).memory_used_bytes
    done = subprocess.run([sys.executable, "-c", TWO_JOBS, str(config), str(work / "ipc-logs")], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env=child_environment())
    with Nvml() as nvml:
        after = nvml.device(0).memory_used_bytes
    runs = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
    warned = IPC_WARNING in done.stderr
    codes = [run[0] for run in runs]
    reserved = [run[1] for run in runs]
    used = [run[2] / 2**20 for run in runs]  # MiB on the GPU after each job, the process's own context included
    grew = used[-1] - used[0] if used else math.inf
    ok = (codes == [0, 0, 0] and all(not any(held) for held in reserved) and not warned and grew < 16
          and abs(after - before) < 64 * 2**20)
    return verdict("ipc", ok, f"three jobs in one process: exits {codes}, reserved after each {reserved} B, GPU used "
                              f"after each {[round(mib) for mib in used]} MiB (grew {grew:.0f} MiB); IPC warning: "
                              f"{warned}; {before / 2**20:.0f} MiB used before, {after / 2**20:.0f} MiB once it left",
                   stderr=done.stderr[-500:])


def check_contexts(datasets: Datasets, work: Path) -> Check:
    frames: tuple[str, dict[str, Any]] = ("models.toy.SyntheticFrames", TOY)
    net: tuple[str, dict[str, Any]] = ("models.toy.TinyConvNet", {})
    to_cpu = run_job(pipeline([(*frames, 0), (*net, -1)]), 60, work / "contexts-cpu", watch_gpu=True)
    through = run_job(pipeline([(*frames, 0), (*net, 0), (*DISCARD, -1)]), 60, work / "contexts-gpu", watch_gpu=True)
    lines, ok = [], True
    for job, expected in ((to_cpu, {"step0-g0-r0"}), (through, {"main", "step0-g0-r0", "step1-g0-r0"})):
        named = {name for name, pid in job.pids().items() if pid in job.gpu_pids}
        if named:  # NVML reports pids of this namespace: the processes themselves must match
            matches = named == expected and len(job.gpu_pids) == len(expected)
            how = f"by pid: {', '.join(sorted(named))}"
        else:      # another namespace's pids: only their number can be compared
            matches = len(job.gpu_pids) == len(expected)
            how = "counted (NVML reports another pid namespace's pids)"
        ok = ok and job.code == 0 and matches
        lines.append(f"{len(job.gpu_pids)} processes on the GPU (expected {len(expected)}: "
                     f"{', '.join(sorted(expected))}; {how})")
    host: dict[str, Any] = next((p for p in to_cpu.meta.get("processes", []) if p["name"] == "step0-g0-r0"), {})
    ok = ok and host.get("output_device") == "cpu"
    return verdict("contexts", ok, f"GPU step -> CPU step: {lines[0]}, its slots on {host.get('output_device')}; "
                                   f"GPU -> GPU -> CPU: {lines[1]}")


HOLDS_A_CONTEXT = textwrap.dedent("""
    import sys, time
    import torch
    torch.zeros(1, device="cuda:0")
    print("holding", flush=True)
    time.sleep(float(sys.argv[1]))
""")


def start_job_holding_a_context(config: str, logs: str) -> tuple[int, str]:
    """In a process that holds a CUDA context (a bench that ran a loop, pytest after a CUDA test): a job of its own."""
    from rnb.pipeline.gpus import child_environment

    torch.zeros(1, device="cuda:0")
    done = subprocess.run([sys.executable, str(REPO / "benchmark.py"), "-c", config, "-mi", "0", "-v", "10",
                           "--log-dir", logs], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env=child_environment())
    return done.returncode, done.stderr[-300:]


def check_busy(datasets: Datasets, work: Path) -> Check:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "busy.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    own_code, own_err = isolated(start_job_holding_a_context, str(config), str(work / "busy-own"), timeout_s=200)
    stranger = subprocess.Popen([sys.executable, "-c", HOLDS_A_CONTEXT, "120"], stdout=subprocess.PIPE, text=True)
    try:
        assert stranger.stdout is not None
        stranger.stdout.readline()  # it holds its context now
        refused = run_job(json.loads(config.read_text()), 10, work / "busy-stranger")
    finally:
        stranger.kill()
        stranger.wait()
    sentence = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    ok = own_code == 0 and refused.code == 2 and "to be free, found" in sentence
    return verdict("busy", ok, f"started from a process holding a context: exit {own_code}; beside a stranger's: "
                               f"exit {refused.code}: {sentence[:200]}", own=own_err)


def compare_uuids() -> dict[str, Any]:
    from rnb.pipeline.gpus import GpuMismatchError, Nvml, check_device_uuid, nvml_uuid

    with Nvml() as nvml:
        nvml_uuids = [nvml.device(i).uuid for i in range(nvml.device_count())]
    torch_uuids = [nvml_uuid(str(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())]
    try:
        check_device_uuid(0, "GPU-00000000-0000-0000-0000-000000000000", "step0-g0-r0")
        refused = ""
    except GpuMismatchError as error:
        refused = str(error)
    return {"nvml": nvml_uuids, "torch": torch_uuids, "refused": refused}


def check_uuid(datasets: Datasets, work: Path) -> Check:
    found = isolated(compare_uuids)
    same = found["torch"] == found["nvml"][: len(found["torch"])]
    ok = same and "expected torch's cuda:0 to be NVML's GPU 0" in found["refused"]
    return verdict("uuid", ok, f"torch {found['torch']} == NVML {found['nvml']}: {same} "
                               f"(CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')}); a wrong one refused: "
                               f"{bool(found['refused'])}", **found)


def pinned_copy() -> dict[str, Any]:
    from rnb.engines.local.plumbing import PinnedHostSlots, SharedSlot

    slot = SharedSlot.allocate(multiprocessing.get_context("spawn"), ((16, 2**20),), torch.device("cpu"))
    before = slot.tensors[0].is_pinned()
    pinned = PinnedHostSlots()
    pinned.pin([slot])
    data = torch.rand((16, 2**20), device="cuda:0")
    torch.cuda.synchronize()
    started = time.perf_counter()
    slot.write((data,), "gpu check")
    returned = time.perf_counter() - started
    torch.cuda.current_stream().synchronize()
    done = time.perf_counter() - started
    equal = bool(torch.equal(slot.tensors[0], data.cpu()))
    result = {"pinned_before": before, "pinned": slot.tensors[0].is_pinned(), "returned_ms": returned * 1000,
              "done_ms": done * 1000, "equal": equal}
    pinned.unpin()
    slot.release()
    return result


def check_pinned(datasets: Datasets, work: Path) -> Check:
    found = isolated(pinned_copy)
    ok = not found["pinned_before"] and found["pinned"] and found["equal"] and found["returned_ms"] < 0.5 * found["done_ms"]
    return verdict("pinned", ok, f"shared host slot page-locked: {found['pinned']}; 64 MiB device-to-host copy "
                                 f"returned after {found['returned_ms']:.2f} ms, done after {found['done_ms']:.2f} ms",
                   **found)


def compare_dtypes() -> dict[str, Any]:
    from models.r2p1d import R2P1DRunner

    device = torch.device("cuda:0")
    x = torch.rand((4, 3, 8, 112, 112), device=device)
    found: dict[str, Any] = {}
    reference = None
    for dtype, layout in (("float32", False), ("float16", False), ("bfloat16", False), ("float32", True),
                          ("bfloat16", True)):
        net = R2P1DRunner(device, 1, 5, num_clips=4, clip_length=8, size=112, dtype=dtype, channels_last=layout)
        for _ in range(3):
            (out,), _, _ = net((x,), {}, TimeCard(0))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            (out,), _, _ = net((x,), {}, TimeCard(0))
        torch.cuda.synchronize()
        rate = 20 / (time.perf_counter() - started)
        out = out.float()
        reference = out if reference is None else reference
        name = dtype + ("+channels_last" if layout else "")
        found[name] = {"items_per_s": rate,
                       "relative_error": float((out - reference).abs().max() / reference.abs().max().clamp_min(1e-12))}
    return found


def check_dtype(datasets: Datasets, work: Path) -> Check:
    found = isolated(compare_dtypes)
    bounds = {"float16": 0.02, "bfloat16": 0.1, "float32+channels_last": 0.01, "bfloat16+channels_last": 0.1}
    ok = all(found[name]["relative_error"] <= bound for name, bound in bounds.items())
    return verdict("dtype", ok, "; ".join(f"{name} {value['items_per_s']:.0f} items/s (error {value['relative_error']:.1e})"
                                          for name, value in found.items()), **found)


CHECKS: dict[str, Callable[[Datasets, Path], Check]] = {
    "seam": check_seam, "stage-times": check_stage_times, "nvdec": check_nvdec, "nvdec-frames": check_nvdec_frames,
    "fallback": check_fallback, "ipc": check_ipc, "contexts": check_contexts, "busy": check_busy,
    "uuid": check_uuid, "pinned": check_pinned, "dtype": check_dtype,
}


def gpu_rows(effort: Effort) -> list[Row]:
    """P8 and P8d for bench/run.py, over datasets made on the spot."""
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        return p8_rows(Datasets(Path(tmp)), effort)


def p8_rows(datasets: Datasets, effort: Effort | None = None) -> list[Row]:
    """P8 and P8d over the NVDEC dataset (by default --quick's windows: the budget holds one job per side)."""
    effort = effort or Effort.of(quick=True)
    loader = (LOADER[0], {**LOADER[1], "dataset": str(datasets.good)})
    whole = (loader, NETWORK)
    items = effort.pick(60, 120)
    return [
        harness_pair(effort, "P8", "R(2+1)D pipeline on one GPU: harness (loader -> network) / one loop",
                     Goal(">=", 0.95), ("harness", chain_pipeline(whole, 0)),
                     ("loop", lambda n: loop_throughput(whole, "cuda:0", n)), items,
                     "EpisodeLoader (NVDEC into shared CUDA slots) -> R2P1DRunner stages 1-5, 4 clips x 8 frames"),
        harness_pair(effort, "P8d", "loader alone: cuda:0 (NVDEC) / CPU", None,
                     ("cuda:0", chain_pipeline((loader, DISCARD), 0)), ("cpu", chain_pipeline((loader, DISCARD), -1)),
                     items, "EpisodeLoader then a discarding final step"),
    ]


def gpu_test_files() -> list[str]:
    """The test files with GPU-marked tests that this machine can import (the lent ones have no Ray)."""
    files = sorted(path for path in (REPO / "tests").glob("test_*.py") if "pytest.mark.gpu" in path.read_text())
    if importlib.util.find_spec("ray") is None:
        files = [path for path in files if not any(name in path.read_text() for name in ("import ray", "ray_testing"))]
    return [str(path.relative_to(REPO)) for path in files]


def gpu_tests(timeout_s: float) -> Check:
    """The GPU-marked tests: whether they passed, and pytest's last line."""
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                               *gpu_test_files()], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check("tests", "FAIL", f"pytest -m gpu ran past {timeout_s:.0f} s")
    lines = (done.stdout + done.stderr).strip().splitlines()
    print("\n".join(lines[-30:]), flush=True)
    return verdict("tests", done.returncode == 0, lines[-1] if lines else "pytest printed nothing")


def run_checks(names: Sequence[str], with_tests: bool, with_p8: bool) -> tuple[list[Check], list[Row]]:
    started = time.monotonic()
    checks: list[Check] = []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        datasets = Datasets(Path(tmp) / "data")
        for name in names:
            try:
                check = CHECKS[name](datasets, Path(tmp) / name)
            except Exception as error:  # one check's failure is its line; the others still run
                check = Check(name, "FAIL", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
            checks.append(check)
            print(check.line(), flush=True)
        if with_p8:
            try:
                rows = p8_rows(datasets)
            except Exception as error:
                rows = [Row("P8", "did not run", None, note=f"failed: {type(error).__name__}: {error}")]
            print(table_text(rows), flush=True)
    if with_tests:
        left = BUDGET_S - (time.monotonic() - started)
        check = gpu_tests(left) if left > 30 else Check("tests", "SKIP", f"only {left:.0f} s of the budget left")
        checks.append(check)
        print(check.line(), flush=True)
    return checks, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here (default: $OUT/gpu_check.json if OUT is set)")
    parser.add_argument("--only", help=f"comma-separated checks to run ({', '.join(CHECKS)}, P8, tests)")
    parser.add_argument("--skip-tests", action="store_true", help="leave the GPU pytest tests out")
    parser.add_argument("--prepare", action="store_true", help=f"download the wheels to carry into {WHEEL_DIR}/ and exit")
    args = parser.parse_args(argv)
    if args.prepare:
        total = gpu_bundle.prepare(WHEEL_DIR)
        print(f"bench/gpu_check.py: {WHEEL_DIR}/ holds {total / 2**20:.1f} MiB of wheels to carry", flush=True)
        return 0
    if WHEEL_DIR.is_dir() and BUNDLED not in os.environ:
        env = gpu_bundle.install(WHEEL_DIR, Path(tempfile.gettempdir()) / "rnb-gpu-bundle")
        again = [sys.executable, "-m", "bench.gpu_check", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(again, env={**os.environ, **env, BUNDLED: "1"}).returncode
    only = [name.strip() for name in args.only.split(",")] if args.only else [*CHECKS, "P8", "tests"]
    unknown = sorted(set(only) - {*CHECKS, "P8", "tests"})
    if unknown:
        print(f"bench/gpu_check.py: --only: expected names among {', '.join([*CHECKS, 'P8', 'tests'])}, "
              f"found {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():  # asks the driver how many GPUs there are; creates no context
        print("bench/gpu_check.py: torch sees no CUDA device; run this on a GPU machine", file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    from rnb.pipeline.gpus import Nvml

    with Nvml() as nvml:
        gpu = nvml.device(0).name
    print(f"bench/gpu_check.py: torch {torch.__version__} (CUDA {torch.version.cuda}) on {gpu}", flush=True)
    started = time.time()
    checks, rows = run_checks([name for name in only if name in CHECKS], "tests" in only and not args.skip_tests,
                              "P8" in only)
    seconds = time.time() - started
    passed = sum(check.status != "FAIL" for check in checks)
    print(f"bench/gpu_check.py: {passed}/{len(checks)} checks passed in {seconds:.0f} s", flush=True)
    target = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    if target is not None:
        target.write_text(json.dumps({"started": started, "seconds": seconds, "gpu": gpu, "torch": torch.__version__,
                                      "checks": [asdict(check) for check in checks],
                                      "rows": [row.to_json() for row in rows]}, indent=2, default=str))
    return 0 if passed == len(checks) else 1  # P8's goal is a figure to report, not a check


if __name__ == "__main__":
    sys.exit(main())
