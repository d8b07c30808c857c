"""What the checks of the prepared GPU run (bench/gpu_check.py) share: a check's line, the datasets, jobs run
through benchmark.py with NVML watching the GPU.

Each check takes the run's datasets, a folder of its own and the deadline
its waits keep to, and returns its line (`Check`); an exception is its FAIL
line. Every piece of GPU work runs in processes of its own (jobs through
benchmark.py, the rest through bench.bounded.isolated), so the process that
runs the checks never holds a CUDA context: NVML's view of the GPU is the
jobs' alone. torch is imported where a check uses it, so that the processes
bench.bounded spawns for the CPU rehearsal start without it.
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.bounded import NO_DEADLINE, Deadline, finish, isolated, start

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
DISCARD: tuple[str, dict[str, Any]] = ("bench.scaling_bench.Discard", {})
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
