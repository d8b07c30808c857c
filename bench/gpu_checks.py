"""The checks of bench/gpu_check.py, one function per line of its output, and what they share.

Each check takes the run's datasets, a folder of its own and the deadline
its waits keep to, and returns its line (`Check`); an exception is its FAIL
line. Every piece of GPU work runs in processes of its own (jobs through
benchmark.py, the rest through bench.bounded.isolated), so the process that
runs the checks never holds a CUDA context: NVML's view of the GPU is the
jobs' alone. torch is imported where a check uses it, so that the processes
bench.bounded spawns for the CPU rehearsal start without it.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench.bounded import NO_DEADLINE, Deadline, Overrun, finish, first_line, isolated, kill_group, start
from bench.common import Effort, Goal, Row, table_text

if TYPE_CHECKING:
    from rnb.core.device import DeviceMark

REPO = Path(__file__).resolve().parents[1]
JOB_S = 120.0               # one benchmark.py job's own bound (they take seconds on a GPU machine)
ISOLATED_S = 120.0          # one isolated call's
PYTEST_S = 600.0            # pytest's (its share of the deadline is what bounds it in practice)
SPIN_MS = 20.0
SEAM_SPIN_MS = 50.0         # the spin the seam check times both on the device and on the host
FRAME_TOLERANCE = 3         # torchcodec's test tolerance for CUDA frames against CPU frames (CUDA 13 builds)
IPC_WARNING = "Producer process has been terminated before all shared CUDA tensors released"
LOADER = ("models.episode.EpisodeLoader", {"num_clips": 4, "clip_length": 8, "size": 112})
NETWORK = ("models.r2p1d.R2P1DRunner", {"start_index": 1, "end_index": 5, "num_clips": 4, "clip_length": 8,
                                        "size": 112})
DISCARD: tuple[str, dict[str, Any]] = ("bench.harness_bench.Discard", {})
TOY = {"clips": 2, "frames": 4, "height": 16, "width": 16}
SYNTHETIC: dict[str, dict[str, Any]] = {  # 256x256 H.264 (NVDEC decodes it) and 32x32 (under NVDEC's minimum width)
    "good": {"episodes": 8, "cameras": 1, "episodes_per_file": 4, "width": 256, "height": 256, "min_length": 30,
             "max_length": 60},
    "tiny": {"episodes": 2, "cameras": 1, "episodes_per_file": 2, "width": 32, "height": 32, "min_length": 12,
             "max_length": 16},
}


@dataclass(frozen=True)
class Check:
    """One line of the run: a check's name, PASS/FAIL/SKIP, its figure, what it saw and its seconds (for the JSON)."""

    name: str
    status: str
    figure: str
    seen: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<13} {self.figure}"


def verdict(name: str, ok: bool, figure: str, **seen: Any) -> Check:
    return Check(name, "PASS" if ok else "FAIL", figure, seen)


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"


class Datasets:
    """The synthetic datasets the checks read, each made on first use, in a process of its own, within the deadline.

    A dataset that could not be made fails every check that reads it with the
    same sentence, at once: the checks that read none still run.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[str, Path | str] = {}

    def get(self, kind: str, deadline: Deadline) -> Path:
        if kind not in self._made:
            try:
                self._made[kind] = Path(isolated(make_synthetic, kind, str(self.root), deadline=deadline,
                                                 own_s=ISOLATED_S))
            except Exception as error:
                self._made[kind] = f"the {kind} dataset could not be made: {one_line(error)}"
        made = self._made[kind]
        if isinstance(made, str):
            raise RuntimeError(made)
        return made


def make_synthetic(kind: str, root: str) -> str:
    from episodes.synthetic import SyntheticSpec, make_dataset

    return str(make_dataset(Path(root) / kind, SyntheticSpec(**SYNTHETIC[kind])))


CheckFunction = Callable[[Datasets, Path, Deadline], Check]


@dataclass(frozen=True)
class Step:
    """One line of a run: its check, and the seconds it keeps for itself that the steps before it may not use."""

    name: str
    run: CheckFunction
    kept_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    """A run's steps in order, its default deadline, and the least time left for which a step is started."""

    title: str
    steps: tuple[Step, ...]
    deadline_s: float
    min_start_s: float

    def only(self, names: Sequence[str]) -> Plan:
        return replace(self, steps=tuple(step for step in self.steps if step.name in names))


@dataclass(frozen=True)
class GpuWatch:
    """NVML's compute processes on GPU 0 while a job ran: every pid, the most entries listed at once, or its error."""

    pids: frozenset[int] = frozenset()
    most: int = 0
    error: str = ""


@dataclass(frozen=True)
class Job:
    """What one benchmark.py run left: its exit code, stderr, log, and the GPU processes NVML saw meanwhile."""

    code: int
    pid: int                          # the job's main process
    stderr: str
    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    job_dir: Path | None
    watch: GpuWatch = GpuWatch()

    def pids(self) -> dict[str, int]:
        """Every process of the job by name, the main process as "main"."""
        return {"main": self.pid, **{p["name"]: p["pid"] for p in self.meta.get("processes", []) if p["pid"]}}

    def column(self, name: str) -> list[Any]:
        return [row.get(name) for row in self.rows]


def pipeline(steps: Sequence[tuple[str, dict[str, Any], int]], source: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config of one runner per step, (model, keywords, gpu) each."""
    from bench.harness_bench import chain_pipeline

    config = chain_pipeline(tuple((model, kwargs) for model, kwargs, _ in steps), 0)
    for step, (_, _, gpu) in zip(config["pipeline"], steps):
        step["queue_groups"][0]["gpus"] = [gpu]
    if source is not None:
        config["source"] = source
    return config


def run_job(config: dict[str, Any], items: int, work: Path, deadline: Deadline = NO_DEADLINE, extra: Sequence[str] = (),
            watch_gpu: bool = False) -> Job:
    """benchmark.py over `config` in a session of its own (bulk, `items`), optionally watching NVML's GPU processes.

    Past min(JOB_S, the time left) the job is killed with its process group (Overrun).
    """
    import pyarrow.parquet as pq

    from rnb.pipeline.gpus import child_environment

    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.json"
    path.write_text(json.dumps(config))
    logs = Path(tempfile.mkdtemp(dir=work, prefix="logs-"))
    child = start([sys.executable, str(REPO / "benchmark.py"), "-c", str(path), "-mi", "0", "-v", str(items),
                   "--warmup", "0", "--log-dir", str(logs), *extra], cwd=REPO, env=child_environment())
    found: list[GpuWatch] = []
    ended = threading.Event()
    watcher = threading.Thread(target=_watch_gpu, args=(ended, found), daemon=True) if watch_gpu else None
    if watcher is not None:
        watcher.start()
    try:
        _, stderr = finish(child, deadline, JOB_S, f"the job in {work.name}")
    finally:
        ended.set()
        if watcher is not None:
            watcher.join()
    jobs = list(logs.iterdir())
    meta = json.loads((jobs[0] / "meta.json").read_text()) if jobs else {}
    rows = pq.read_table(jobs[0] / "timings.parquet").to_pylist() if jobs and (jobs[0] / "timings.parquet").exists() else []
    return Job(child.returncode, child.pid, stderr, meta, rows, jobs[0] if jobs else None, *found)


def _watch_gpu(ended: threading.Event, found: list[GpuWatch]) -> None:
    """NVML's compute processes on GPU 0 until `ended` is set, into `found` (NVML's errors too: this is a thread)."""
    from rnb.pipeline.gpus import Nvml

    pids: set[int] = set()
    most = 0
    try:
        with Nvml() as nvml:
            while not ended.wait(0.02):
                state = nvml.device(0)
                if state.compute_pids is None:
                    found.append(GpuWatch(frozenset(pids), most, state.process_query_error))
                    return
                pids.update(state.compute_pids)
                most = max(most, len(state.compute_pids))
    except Exception as error:
        found.append(GpuWatch(frozenset(pids), most, one_line(error)))
        return
    found.append(GpuWatch(frozenset(pids), most))


# ---------------------------------------------------------------- the device seam

class SpinningDevice(Protocol):
    """What the seam check needs of a device: marks in its queue, work of about a given length, a synchronise."""

    events_bound_us: float  # what the seam may cost per item on it
    spin_tolerance: float   # how far, as a fraction, its marks' reading of a spin may be from the host's

    def mark(self) -> DeviceMark: ...

    def spin(self, ms: float) -> None: ...

    def synchronize(self) -> None: ...


class CudaSpinner:
    """A CUDA stream as the seam check's device: CudaQueue's events, torch.cuda._sleep's spins.

    The spin's cycles per millisecond are counted by the host's clock around
    a synchronise (after 0.2 s of warm-up: an idle GPU clocks at a fraction
    of its boost), so that the events' reading of a spin is compared with a
    clock they did not set.
    """

    events_bound_us = 100.0
    spin_tolerance = 0.05

    def __init__(self, cycles: int = 10_000_000) -> None:
        import torch

        from rnb.core.device import CudaQueue

        self.stream = torch.cuda.Stream()
        self.queue = CudaQueue(self.stream)
        until = time.perf_counter() + 0.2
        while time.perf_counter() < until:
            self._sleep(cycles // 10)
            self.synchronize()
        started = time.perf_counter()
        self._sleep(cycles)
        self.synchronize()
        self.cycles_per_ms = cycles / ((time.perf_counter() - started) * 1000)

    def _sleep(self, cycles: int) -> None:
        import torch

        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(cycles)

    def mark(self) -> DeviceMark:
        return self.queue.mark()

    def spin(self, ms: float) -> None:
        self._sleep(int(ms * self.cycles_per_ms))

    def synchronize(self) -> None:
        self.stream.synchronize()


def seam_costs(device_type: Callable[[], SpinningDevice], items: int = 2000) -> dict[str, float]:
    """µs per item of the runner's seam (two marks, a wait, an elapsed time) and of a bare synchronise, and a
    SEAM_SPIN_MS spin read by the device's marks and by the host's clock around them."""
    device = device_type()

    def per_item(work: Callable[[], object]) -> float:
        started = time.perf_counter()
        for _ in range(items):
            work()
        return (time.perf_counter() - started) / items * 1e6

    def marks() -> float:
        began = device.mark()
        done = device.mark()
        done.wait()
        return done.ms_since(began)
    per_item(marks)  # warm-up
    costs = {"events_us": per_item(marks), "synchronize_us": per_item(device.synchronize)}
    device.synchronize()
    started = time.perf_counter()
    began = device.mark()
    device.spin(SEAM_SPIN_MS)
    done = device.mark()
    done.wait()
    host_ms = (time.perf_counter() - started) * 1000
    return {**costs, "spin_device_ms": done.ms_since(began), "spin_host_ms": host_ms,
            "events_bound_us": device.events_bound_us, "spin_tolerance": device.spin_tolerance}


def check_seam(device_type: Callable[[], SpinningDevice], datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    costs = isolated(seam_costs, device_type, deadline=deadline, own_s=ISOLATED_S)
    device_ms, host_ms = costs["spin_device_ms"], costs["spin_host_ms"]
    agree = abs(device_ms - host_ms) <= max(1.0, costs["spin_tolerance"] * host_ms) and host_ms >= SEAM_SPIN_MS / 2
    ok = costs["events_us"] < costs["events_bound_us"] and agree
    return verdict("seam", ok, f"marks {costs['events_us']:.1f} us/item, bare synchronise {costs['synchronize_us']:.1f} "
                               f"us/item (empty items); a {SEAM_SPIN_MS:g} ms spin read {device_ms:.2f} ms by the marks, "
                               f"{host_ms:.2f} ms by the host's clock", **costs)


# ---------------------------------------------------------------- jobs on the GPU

def check_stage_times(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    import pyarrow.parquet as pq

    from rnb.core.stages import END_TO_END, part_latencies

    spin = ("models.toy.GpuSpin", {"ms": SPIN_MS, **TOY})
    job = run_job(pipeline([(*spin, 0), (*spin, 0), (*spin, 0)]), 40, work, deadline)
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
    device = sorted(value for value in job.column("device_ms1") if value is not None)
    inside = sorted((row["inference1_finish"] - row["inference1_start"]) * 1000 for row in job.rows)
    median_device = f"{device[len(device) // 2]:.2f} ms" if device else "missing"
    ok = not short and not slow and adds_up and len(job.rows) == 40
    return verdict("stage-times", ok, f"{3 * len(job.rows) - len(short)}/{3 * len(job.rows)} item-steps inside >= "
                                      f"device_ms; step 1 median device_ms {median_device}, inside "
                                      f"{inside[len(inside) // 2] if inside else math.nan:.2f} ms ({SPIN_MS:g} ms "
                                      f"spins); stages add up: {adds_up}", short=short[:5], slow=slow[:5])


def check_nvdec(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    """NVDEC decodes every item. NVML's decoder percentage is shown, not judged: a whole-percent average over
    NVML's sample period can read 0 for a few small items."""
    import pyarrow.parquet as pq

    loader = (LOADER[0], {**LOADER[1], "require_nvdec": True})
    source = {"dataset": str(datasets.get("good", deadline))}
    job = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], source), 80, work, deadline, ["--sample-interval-ms", "50"])
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
    ok = devices == {"nvdec"} and warmed and said and decode_ms[0] <= 3 * median
    return verdict("nvdec", ok, f"decode_device {sorted(devices)}; item 0 decoded in {decode_ms[0]:.1f} ms, median "
                                f"{median:.1f} ms; warm-up noted: {warmed}; NVML decoder busy up to {busiest}% "
                                "(shown, not judged)", notes=notes)


def check_nvdec_overlap(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    """The loader decodes on NVDEC while the network fetches: clips fetched ahead through the WAN profile reach the
    slower of the link and decoding from local disk (bench.overlap_bench.overlap_rates)."""
    from bench.overlap_bench import overlap_rates

    found = isolated(overlap_rates, str(datasets.get("good", deadline)), "cuda:0", deadline=deadline, own_s=ISOLATED_S)
    bound = min(found["local_items_per_s"], found["link_items_per_s"])
    ok = found["devices"] == ["nvdec"] and found["fetched_ahead"] == 1.0 and found["wan_items_per_s"] >= 0.9 * bound
    return verdict("nvdec-overlap", ok, f"items/s through the WAN profile {found['wan_items_per_s']:.1f}, from local "
                                        f"disk {found['local_items_per_s']:.1f}, the link's {found['link_items_per_s']:.1f} "
                                        f"(goal: 0.9 of the slower); fetched ahead {found['fetched_ahead']:.0%}, waited "
                                        f"{found['wait_ms']:.1f} ms, decoding {found['decode_ms']:.1f} ms; decode_device "
                                        f"{found['devices']}", **found)


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


def check_nvdec_frames(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_frames, str(datasets.get("good", deadline)), deadline=deadline, own_s=ISOLATED_S)
    return verdict("nvdec-frames", found["max_abs"] <= FRAME_TOLERANCE,
                   f"NVDEC vs CPU: max |difference| {found['max_abs']:.0f} (tolerance {FRAME_TOLERANCE}), mean "
                   f"{found['mean_abs']:.3f}, lowest PSNR {found['min_psnr_db']:.1f} dB", **found)


def check_fallback(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    source = {"dataset": str(datasets.get("tiny", deadline))}
    loader = (LOADER[0], {**LOADER[1], "num_clips": 1, "clip_length": 4, "size": 32})
    quiet = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], source), 4, work / "quiet", deadline)
    strict = run_job(pipeline([(loader[0], {**loader[1], "require_nvdec": True}, 0), (*DISCARD, 0)], source), 4,
                     work / "required", deadline)
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


def check_ipc(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    from rnb.pipeline.gpus import Nvml, child_environment

    work.mkdir(parents=True, exist_ok=True)
    config = work / "ipc.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    with Nvml() as nvml:
        before = nvml.device(0).memory_used_bytes
    child = start([sys.executable, "-c", TWO_JOBS, str(config), str(work / "logs")], cwd=REPO, env=child_environment())
    stdout, stderr = finish(child, deadline, 3 * JOB_S, "three jobs in one process")
    with Nvml() as nvml:
        after = nvml.device(0).memory_used_bytes
    runs = json.loads(stdout.strip().splitlines()[-1]) if child.returncode == 0 else []
    warned = IPC_WARNING in stderr
    codes = [run[0] for run in runs]
    reserved = [run[1] for run in runs]
    used = [run[2] / 2**20 for run in runs]  # MiB on the GPU after each job, the process's own context included
    grew = used[-1] - used[0] if used else math.inf
    ok = (codes == [0, 0, 0] and all(not any(held) for held in reserved) and not warned and grew < 16
          and abs(after - before) < 64 * 2**20)
    return verdict("ipc", ok, f"three jobs in one process (exit {child.returncode}): exits {codes}, reserved after "
                              f"each {reserved} B, GPU used after each {[round(mib) for mib in used]} MiB (grew "
                              f"{grew:.0f} MiB); IPC warning: {warned}; {before / 2**20:.0f} MiB used before, "
                              f"{after / 2**20:.0f} MiB once it left", stderr=stderr[-500:])


def contexts_seen(job: Job, expected: set[str]) -> tuple[bool | None, str]:
    """Whether NVML saw exactly the `expected` processes of `job` on the GPU (None: it could not tell), and how."""
    watch = job.watch
    if watch.error:
        return None, f"unknown: NVML could not list the compute processes ({watch.error})"
    named = {name for name, pid in job.pids().items() if pid in watch.pids}
    if named:  # NVML reports pids of this namespace: the processes themselves must match
        return (named == expected and len(watch.pids) == len(expected),
                f"{len(watch.pids)} on the GPU by pid: {', '.join(sorted(named))}")
    # another namespace's pids: only their number can be compared, as the most entries NVML listed at once
    return watch.most == len(expected), (f"NVML listed at most {watch.most} at once, under {len(watch.pids)} pid(s) "
                                         "of another pid namespace")


def check_contexts(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    frames: tuple[str, dict[str, Any]] = ("models.toy.SyntheticFrames", TOY)
    net: tuple[str, dict[str, Any]] = ("models.toy.TinyConvNet", {})
    to_cpu = run_job(pipeline([(*frames, 0), (*net, -1)]), 60, work / "cpu", deadline, watch_gpu=True)
    through = run_job(pipeline([(*frames, 0), (*net, 0), (*DISCARD, -1)]), 60, work / "gpu", deadline, watch_gpu=True)
    lines, results = [], []
    for job, expected in ((to_cpu, {"step0-g0-r0"}), (through, {"main", "step0-g0-r0", "step1-g0-r0"})):
        matches, how = contexts_seen(job, expected)
        results.append(job.code == 0 and matches)
        lines.append(f"exit {job.code}, expected {len(expected)} ({', '.join(sorted(expected))}), {how}")
    host: dict[str, Any] = next((p for p in to_cpu.meta.get("processes", []) if p["name"] == "step0-g0-r0"), {})
    figure = (f"GPU step -> CPU step: {lines[0]}, its slots on {host.get('output_device')}; GPU -> GPU -> CPU: "
              f"{lines[1]}")
    if None in results:
        return Check("contexts", "SKIP", figure)
    return verdict("contexts", all(results) and host.get("output_device") == "cpu", figure)


HOLDS_A_CONTEXT = textwrap.dedent("""
    import sys, time
    import torch
    torch.zeros(1, device="cuda:0")
    print("holding", flush=True)
    time.sleep(float(sys.argv[1]))
""")


def start_job_holding_a_context(config: str, logs: str) -> tuple[int, str]:
    """In a process that holds a CUDA context (a bench that ran a loop, pytest after a CUDA test): a job of its own.

    Its session is the isolated process's, so a kill of that reaches it too.
    """
    import subprocess

    import torch

    from rnb.pipeline.gpus import child_environment

    torch.zeros(1, device="cuda:0")
    done = subprocess.run([sys.executable, str(REPO / "benchmark.py"), "-c", config, "-mi", "0", "-v", "10",
                           "--log-dir", logs], cwd=REPO, capture_output=True, text=True, env=child_environment())
    return done.returncode, done.stderr[-300:]


def check_busy(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "busy.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    own_code, own_err = isolated(start_job_holding_a_context, str(config), str(work / "own"), deadline=deadline,
                                 own_s=JOB_S)
    stranger = start([sys.executable, "-c", HOLDS_A_CONTEXT, str(2 * JOB_S)])
    try:
        first_line(stranger, deadline, 60.0, "a stranger's process taking a CUDA context")
        refused = run_job(json.loads(config.read_text()), 10, work / "stranger", deadline)
    finally:
        kill_group(stranger.pid)
        stranger.communicate()
    sentence = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    ok = own_code == 0 and refused.code == 2 and "to be free, found" in sentence
    return verdict("busy", ok, f"started from a process holding a context: exit {own_code}; beside a stranger's: "
                               f"exit {refused.code}: {sentence[:200]}", own=own_err)


# ---------------------------------------------------------------- isolated calls

def compare_uuids() -> dict[str, Any]:
    import torch

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


def check_uuid(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_uuids, deadline=deadline, own_s=ISOLATED_S)
    same = found["torch"] == found["nvml"][: len(found["torch"])]
    ok = same and "expected torch's cuda:0 to be NVML's GPU 0" in found["refused"]
    return verdict("uuid", ok, f"torch {found['torch']} == NVML {found['nvml']}: {same} "
                               f"(CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')}); a wrong one refused: "
                               f"{bool(found['refused'])}", **found)


def pinned_copy() -> dict[str, Any]:
    import torch

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


def check_pinned(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(pinned_copy, deadline=deadline, own_s=ISOLATED_S)
    ok = not found["pinned_before"] and found["pinned"] and found["equal"] and found["returned_ms"] < 0.5 * found["done_ms"]
    return verdict("pinned", ok, f"shared host slot page-locked: {found['pinned']}; 64 MiB device-to-host copy "
                                 f"returned after {found['returned_ms']:.2f} ms, done after {found['done_ms']:.2f} ms",
                   **found)


def compare_dtypes() -> dict[str, Any]:
    import torch

    from models.r2p1d import R2P1DRunner
    from rnb.core.timecard import TimeCard

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


def check_dtype(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_dtypes, deadline=deadline, own_s=ISOLATED_S)
    bounds = {"float16": 0.02, "bfloat16": 0.1, "float32+channels_last": 0.01, "bfloat16+channels_last": 0.1}
    ok = all(found[name]["relative_error"] <= bound for name, bound in bounds.items())
    return verdict("dtype", ok, "; ".join(f"{name} {value['items_per_s']:.0f} items/s (error {value['relative_error']:.1e})"
                                          for name, value in found.items()), **found)


# ---------------------------------------------------------------- the tests and P8

def gpu_test_files() -> list[str]:
    """The test files with GPU-marked tests that this machine can import (the lent ones have no Ray)."""
    files = sorted(path for path in (REPO / "tests").glob("test_*.py") if "pytest.mark.gpu" in path.read_text())
    if importlib.util.find_spec("ray") is None:
        files = [path for path in files if not any(name in path.read_text() for name in ("import ray", "ray_testing"))]
    return [str(path.relative_to(REPO)) for path in files]


def run_pytest(arguments: Sequence[str], deadline: Deadline) -> Check:
    """pytest in a session of its own: PASS when it passed and ran a test, SKIP when it ran none, FAIL otherwise.

    Its last 30 lines are printed, also when it is killed at the deadline.
    """
    from rnb.pipeline.gpus import child_environment

    child = start([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments], cwd=REPO,
                  env=child_environment())
    try:
        stdout, stderr = finish(child, deadline, PYTEST_S, "pytest")
    except Overrun as overrun:
        print("\n".join((overrun.stdout + overrun.stderr).strip().splitlines()[-30:]), flush=True)
        raise
    lines = (stdout + stderr).strip().splitlines()
    print("\n".join(lines[-30:]), flush=True)
    last = lines[-1] if lines else "pytest printed nothing"
    ran = re.search(r"\b[1-9]\d* passed\b", last) is not None
    if child.returncode in (0, 5) and not ran:
        return Check("tests", "SKIP", f"pytest passed no test (exit {child.returncode}): {last}")
    return verdict("tests", child.returncode == 0, f"exit {child.returncode}: {last}")


def check_gpu_tests(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    return run_pytest(["-m", "gpu", *gpu_test_files()], deadline)


def p8_rows(dataset: Path, effort: Effort | None = None, deadline: Deadline = NO_DEADLINE) -> list[Row]:
    """P8 and P8d over the NVDEC dataset (by default --quick's windows: the budget holds one job per side)."""
    from bench.harness_bench import chain_pipeline, harness_pair, loop_throughput

    effort = effort or Effort.of(quick=True)
    loader = (LOADER[0], {**LOADER[1], "dataset": str(dataset)})
    whole = (loader, NETWORK)
    items = effort.pick(60, 120)
    return [
        harness_pair(effort, "P8", "R(2+1)D pipeline on one GPU: harness (loader -> network) / one loop",
                     Goal(">=", 0.95), ("harness", chain_pipeline(whole, 0)),
                     ("loop", lambda n: loop_throughput(whole, "cuda:0", n, deadline)), items,
                     "EpisodeLoader (NVDEC into shared CUDA slots) -> R2P1DRunner stages 1-5, 4 clips x 8 frames",
                     deadline),
        harness_pair(effort, "P8d", "loader alone: cuda:0 (NVDEC) / CPU", None,
                     ("cuda:0", chain_pipeline((loader, DISCARD), 0)), ("cpu", chain_pipeline((loader, DISCARD), -1)),
                     items, "EpisodeLoader then a discarding final step", deadline),
    ]


def rows_check(rows: list[Row]) -> Check:
    """P8's rows as one line: PASS when every row has its figure (its goal is a figure to report, not a check)."""
    print(table_text(rows), flush=True)
    figures = "; ".join(f"{row.id} {'did not run' if row.ratio is None else f'{row.ratio:.2f}'}"
                        + (f" (goal {row.goal}, met: {row.met})" if row.goal is not None else "") for row in rows)
    return verdict("P8", all(row.ratio is not None for row in rows), figures, rows=[row.to_json() for row in rows])


def check_p8(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    return rows_check(p8_rows(datasets.get("good", deadline), deadline=deadline))


def gpu_rows(effort: Effort) -> list[Row]:
    """P8 and P8d for bench/run.py, over a dataset made on the spot."""
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        return p8_rows(Datasets(Path(tmp)).get("good", NO_DEADLINE), effort)


CHECKS: dict[str, CheckFunction] = {  # cheap and dataset-free first; NVDEC's need the bundle's torchcodec
    "seam": functools.partial(check_seam, CudaSpinner), "uuid": check_uuid, "pinned": check_pinned,
    "stage-times": check_stage_times, "nvdec": check_nvdec, "nvdec-frames": check_nvdec_frames,
    "nvdec-overlap": check_nvdec_overlap,
    "fallback": check_fallback, "contexts": check_contexts, "busy": check_busy, "ipc": check_ipc, "dtype": check_dtype,
}
