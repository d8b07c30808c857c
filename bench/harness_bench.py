"""Harness benchmarks: P1s/P1h/P1c, what the process model costs; P5 (bench/ipc_bench.py), P6
(bench/scaling_bench.py) and P9 (bench/ray_bench.py) build on what is here.

Each compares the harness with what a user would write instead, on the same
work, so the ratio says what RnB's machinery costs or buys.  Harness runs go
through `benchmark.py` in a process of their own, as a user's would (and as
scripts/sweep.py runs them), and use the throughput the job log reports:
items finished between the start gate and the termination flag, start-up
excluded.  Own processes keep one job's CUDA context, slots and allocator
cache from the next job's GPU check and memory, and a loop on a GPU runs
in one too (`loop_throughput`).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq
import torch
import torch.multiprocessing as mp

from bench.bounded import NO_DEADLINE, Deadline, finish, isolated, start
from bench.common import Effort, Goal, Row, Side, compare, measure_pair, paired
from bench.ipc_bench import Peer
from rnb.core.timecard import TimeCard
from rnb.pipeline.dotted import load_object
from rnb.pipeline.gpus import child_environment

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "data" / "synthetic"

JOB_S = 900.0  # the most one whole harness job may take (P1h: and so the gap between two commands to its producer)
LOOP_S = 600.0  # the most one loop on a GPU may take

# P1's two steps: big enough that each call does real work (~ms), as a video model's would.
FRAMES_KW = {"clips": 2, "frames": 8, "height": 112, "width": 112}
NET_KW = {"clips": 2, "classes": 10}


def run_job(config: dict[str, Any], items: int, workdir: Path, extra: tuple[str, ...] = (),
            deadline: Deadline = NO_DEADLINE, load: tuple[str, ...] = ("-mi", "0")) -> Path:
    """Run one job of `config` through benchmark.py in a session of its own, bulk unless `load` says otherwise; its
    job directory.

    Raises unless it reached its target; past min(JOB_S, the time left before
    `deadline`) the job is killed with its process group (bench.bounded.Overrun).
    """
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    log_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="logs-"))
    child = start([sys.executable, str(REPO / "benchmark.py"), "-c", str(config_path), *load, "-v", str(items),
                   "--log-dir", str(log_dir), *extra], cwd=REPO, env=child_environment())
    stdout, stderr = finish(child, deadline, JOB_S, f"the harness job in {log_dir}")
    jobs = list(log_dir.iterdir())
    if len(jobs) != 1:
        raise RuntimeError(f"the harness job in {log_dir} left no log (exit code {child.returncode}): "
                           f"{(stderr or stdout).strip()[-300:]}")
    meta = json.loads((jobs[0] / "meta.json").read_text(encoding="utf-8"))
    if child.returncode != 0 or meta["termination_reason"] != "target reached":
        raise RuntimeError(f"the harness job in {jobs[0]} ended with exit code {child.returncode} "
                           f"({meta['termination_reason']}): {meta['error'] or stderr.strip()[-300:]}")
    return jobs[0]


def run_harness(config: dict[str, Any], items: int, workdir: Path, windows: int = 1,
                deadline: Deadline = NO_DEADLINE) -> list[float]:
    """items/s of one bulk job of `config` over `windows` consecutive slices of its timed window.

    With windows=1 this is the throughput the job log reports.  More windows
    split the items, in the order they finished, into equal groups, each
    timed from the previous group's last finish (the first from the start
    gate); --quick uses them as repetitions because a job's start-up (tens of
    seconds on this shared 2-core machine) makes many jobs too slow.
    Raises if the job did not reach its target.
    """
    job_dir = run_job(config, items, workdir, deadline=deadline)
    meta = json.loads((job_dir / "meta.json").read_text(encoding="utf-8"))
    if windows == 1:
        return [meta["throughput_items_per_s"]]
    return window_rates(meta["start_time"], finish_times(job_dir, meta["num_steps"]), windows)


def finish_times(job_dir: Path, num_steps: int) -> list[float]:
    return sorted(pq.read_table(job_dir / "timings.parquet").column(f"runner{num_steps - 1}_finish").to_pylist())


def window_rates(start: float, finishes: list[float], windows: int) -> list[float]:
    """items/s of `windows` consecutive, near-equal groups of sorted finish times after `start`."""
    edges, counts = window_edges(start, finishes, windows)
    return [count / (edges[w + 1] - edges[w]) for w, count in enumerate(counts)]


def window_edges(start: float, finishes: list[float], windows: int) -> tuple[list[float], list[int]]:
    """The times bounding `windows` near-equal groups of sorted finishes (from `start`), and each group's size."""
    if len(finishes) < windows:
        raise ValueError(f"{len(finishes)} finished items cannot fill {windows} windows")
    bounds = [round(len(finishes) * w / windows) for w in range(windows + 1)]
    edges = [start] + [finishes[bound - 1] for bound in bounds[1:]]
    return edges, [bounds[w + 1] - bounds[w] for w in range(windows)]


def harness_pair(effort: Effort, id: str, what: str, goal: Goal | None, a: tuple[str, dict[str, Any]],
                 b: tuple[str, dict[str, Any] | Callable[[int], float]], items: int, note: str,
                 deadline: Deadline = NO_DEADLINE) -> Row:
    """A harness config against another config (or against an in-process loop taking an item count).

    Full runs interleave whole jobs; --quick runs one job per side and pairs their windows. No job
    outlasts `deadline` (a loop keeps to it by itself).
    """
    with tempfile.TemporaryDirectory(prefix=f"rnb-{id}-") as tmp:
        def measure(side: dict[str, Any] | Callable[[int], float], n: int, windows: int) -> list[float]:
            if callable(side):
                return [side(n // windows) for _ in range(windows)]
            return run_harness(side, n, Path(tmp), windows, deadline)
        if not effort.quick:
            return measure_pair(id, what, goal, (a[0], "items/s", lambda: measure(a[1], items, 1)[0]),
                                (b[0], "items/s", lambda: measure(b[1], items, 1)[0]), effort.reps, warmup=0,
                                note=f"{note}; {items} items per job, jobs interleaved")
        a_values, b_values = measure(a[1], items, effort.reps), measure(b[1], items, effort.reps)
        return compare(id, what, goal, Side.of(a[0], "items/s", a_values), Side.of(b[0], "items/s", b_values),
                       note=f"{note}; --quick: {effort.reps} windows of one {items}-item job per side, "
                            "paired by window, not interleaved")


# ---------------------------------------------------------------- P1 harness efficiency

TOY_STEPS = (("models.toy.SyntheticFrames", FRAMES_KW), ("models.toy.TinyConvNet", NET_KW))
CHAIN_STEPS = 4   # P1s and P1h: a pipeline as deep as RnB's split network
DEEP_CHAIN_STEPS = 8  # P1s8: twice as deep, eight runners sharing the cores with the client and main
SLEEP_MS = 5.0    # P1s: what each step waits, as a step whose work runs on a GPU leaves the CPU free


class Idle:
    """A step that does no work: it waits `sleep_ms` (0: not at all) and hands on one number.

    A pipeline of these measures the harness alone (P1h), or, with a sleep,
    whether the steps overlap as a GPU pipeline's do (P1s).  The output is the
    smallest tensor a step that feeds another may declare.
    """

    def __init__(self, device: torch.device, sleep_ms: float = 0.0) -> None:
        self.sleep_s = sleep_ms / 1000.0
        self.output = torch.zeros(1, device=device)

    @staticmethod
    def output_shape(**kwargs: Any) -> tuple[tuple[int, ...], ...]:
        return ((1,),)

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return (self.output,), non_tensors, time_card


def chain_pipeline(steps: tuple[tuple[str, dict[str, Any]], ...], gpu: int) -> dict[str, Any]:
    """A config running `steps` one runner each on `gpu`, fed numbered requests (the synthetic source)."""
    pipeline = []
    for k, (model, kwargs) in enumerate(steps):
        group: dict[str, Any] = {"gpus": [gpu]}
        if k > 0:
            group["in_queue"] = 0
        step = {"model": model, "queue_groups": [group], **kwargs}
        if k < len(steps) - 1:
            group["out_queues"] = [0]
            step["num_shared_tensors"] = 4
        pipeline.append(step)
    return {"source": {"synthetic": True}, "pipeline": pipeline}


def loop_throughput(steps: tuple[tuple[str, dict[str, Any]], ...], device: str, items: int,
                    deadline: Deadline = NO_DEADLINE) -> float:
    """items/s of the same model calls on the same numbered requests, one after the other in one process.

    On a GPU the loop runs in a spawned process of its own, so that no CUDA
    context stays in this one to be taken for a stranger's by the next job;
    past min(LOOP_S, the time left before `deadline`) it is killed.
    """
    if device.startswith("cuda"):
        return float(isolated(_loop_here, steps, device, items, deadline=deadline, own_s=LOOP_S))
    return _loop_here(steps, device, items)


def _loop_here(steps: tuple[tuple[str, dict[str, Any]], ...], device: str, items: int) -> float:
    models = [load_object(model)(torch.device(device), **kwargs) for model, kwargs in steps]
    started = time.perf_counter()
    for item in range(items):
        tensors, non_tensors, card = (), {"request": item}, TimeCard(item, repr(item))
        for model in models:
            tensors, non_tensors, card = model(tensors, non_tensors, card)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return items / (time.perf_counter() - started)


def p1_sleeping_steps(effort: Effort) -> list[Row]:
    return [sleeping_chain(effort, "P1s", CHAIN_STEPS, Goal(">=", 0.97))]


def p1_deep_sleeping_steps(effort: Effort) -> list[Row]:
    return [sleeping_chain(effort, "P1s8", DEEP_CHAIN_STEPS, Goal(">=", 0.95))]


def sleeping_chain(effort: Effort, id: str, steps: int, goal: Goal) -> Row:
    step = ("bench.harness_bench.Idle", {"sleep_ms": SLEEP_MS})
    return harness_pair(effort, id, f"{steps}-step pipeline of {SLEEP_MS:g} ms waits: harness bulk / "
                        "the slowest step alone in a loop", goal,
                        ("harness", chain_pipeline((step,) * steps, -1)),
                        ("loop", lambda n: loop_throughput((step,), "cpu", n)), effort.pick(500, 600),
                        f"{steps} CPU runners, one per step, each sleeping {SLEEP_MS:g} ms per item (as a GPU "
                        "step leaves the CPU free); the loop runs one such step in this process")


def per_hop_us(items_per_s: float, hops: int) -> float:
    """Microseconds per item per hop of a pipeline whose bulk throughput is `items_per_s`."""
    return 1e6 / (items_per_s * hops)


def _message_producer(out: Any, commands: Any) -> None:
    """Child: per command, put `count` item numbers on a multiprocessing queue, nothing else.

    A whole harness job may run between two commands, hence the long wait.
    """
    while (count := commands.get(timeout=JOB_S)) is not None:
        for item in range(count):
            out.put(item)


def window_cpu_s(job_dir: Path, edges: list[float], processes: Collection[str] | None = None) -> list[float]:
    """CPU seconds a job's processes (all, main included, or those named) spent in each window between `edges`.

    Each process's cumulative CPU time from samples.parquet is interpolated
    at the edges; CPU time, unlike wall time, barely depends on what else
    the machine runs.
    """
    samples = pq.read_table(job_dir / "samples.parquet").to_pylist()
    spent = np.zeros(len(edges) - 1)
    for process in {row["process"] for row in samples if row["process"] is not None}:
        if processes is not None and process not in processes:
            continue
        rows = [(row["time"], row["cpu_s"]) for row in samples if row["process"] == process]
        times, cpu = zip(*sorted(rows))
        spent += np.diff(np.interp(edges, times, cpu))
    return spent.tolist()


def hop_costs(job_dir: Path, windows: int, hops: int) -> list[tuple[float, float]]:
    """(wall, CPU) microseconds per item per hop of each window of a bulk job (see run_harness for windows)."""
    meta = json.loads((job_dir / "meta.json").read_text(encoding="utf-8"))
    edges, counts = window_edges(meta["start_time"], finish_times(job_dir, meta["num_steps"]), windows)
    spent = window_cpu_s(job_dir, edges)
    return [(1e6 * (end - begin) / (count * hops), 1e6 * cpu / (count * hops))
            for begin, end, count, cpu in zip(edges, edges[1:], counts, spent)]


def message_costs(peer: Peer, count: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per bare message: `count` messages from the peer's process to this one."""
    child = psutil.Process(peer.process.pid)
    before = sum(child.cpu_times()[:2]) + time.process_time()
    rate = peer.throughput(count)
    return per_hop_us(rate, 1), 1e6 * (sum(child.cpu_times()[:2]) + time.process_time() - before) / count


def _kept(into: list[tuple[float, float]], costs: tuple[float, float]) -> float:
    """Keep one repetition's (wall, CPU) costs and give paired() its wall figure."""
    into.append(costs)
    return costs[0]


def p1_harness_per_hop(effort: Effort) -> list[Row]:
    """P1h: what the harness costs per item per hop, next to one bare queue message between two processes."""
    items = effort.pick(3000, 6000)
    config = chain_pipeline((("bench.harness_bench.Idle", {}),) * CHAIN_STEPS, -1)
    ctx = mp.get_context("spawn")
    inbox = ctx.Queue()
    peer = Peer(ctx, _message_producer, lambda item: item, inbox, inbox)
    harness: list[tuple[float, float]] = []  # (wall, CPU) us per repetition
    bare: list[tuple[float, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="rnb-P1h-") as tmp:
            if effort.quick:
                harness += hop_costs(run_job(config, items, Path(tmp)), effort.reps, CHAIN_STEPS)
                bare += [message_costs(peer, items // effort.reps) for _ in range(effort.reps)]
            else:
                # paired() alternates the sides and keeps each side's wall figure; the CPU figure rides along.
                paired(lambda: _kept(harness, hop_costs(run_job(config, items, Path(tmp)), 1, CHAIN_STEPS)[0]),
                       lambda: _kept(bare, message_costs(peer, items)), effort.reps, warmup=0)
    finally:
        peer.close()
    how = "--quick: windows of one job, not interleaved" if effort.quick else "jobs interleaved"
    wall = (Side.of("harness", "us/item/hop", [w for w, _ in harness]),
            Side.of("bare queue", "us/message", [w for w, _ in bare]))
    cpu = (Side.of("harness", "CPU us/item/hop", [c for _, c in harness]),
           Side.of("bare queue", "CPU us/message", [c for _, c in bare]))
    return [
        compare("P1h", f"harness time per item per hop, {CHAIN_STEPS} no-op steps (bulk) / one bare multiprocessing "
                       "queue message", Goal("<=", 2.5), *wall,
                note=f"{items} items per job through {CHAIN_STEPS} CPU runners of bench.harness_bench.Idle "
                     f"({statistics.median(wall[0].values):.1f} us per item per hop); B: one int per message from a "
                     f"spawned process through a multiprocessing queue ({statistics.median(wall[1].values):.1f} us); "
                     f"{how}"),
        compare("P1hc", "CPU time of all processes per item per hop / per bare queue message", Goal("<=", 3), *cpu,
                note="CPU seconds from the job's samples.parquet (client, runners and main) and from psutil for "
                     f"the message's two processes; unlike wall time they depend little on the machine's load; {how}"),
    ]


def p1_contention(effort: Effort) -> list[Row]:
    # The loop gives the network every core; the pipeline must too, or P1c would
    # measure the default even split of cores between runners, not the harness.
    config = chain_pipeline(TOY_STEPS, -1)
    config["pipeline"][-1]["threads"] = torch.get_num_threads()
    return [harness_pair(effort, "P1c", "contention: two CPU-bound toy steps through the harness (bulk) / "
                         "one loop in one process", None, ("harness", config),
                         ("loop", lambda n: loop_throughput(TOY_STEPS, "cpu", n)),
                         effort.pick(150, 300),
                         f"SyntheticFrames {FRAMES_KW} -> TinyConvNet, both on CPU; the network step has "
                         f"threads {torch.get_num_threads()}, as many as the loop; on a machine with fewer cores "
                         "than busy threads this measures CPU contention between the steps, not the harness")]
