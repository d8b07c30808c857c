"""P6/P6c: loader replicas on the CPU, items/s against the cores each replica got (the CPU it spent)."""
from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import Effort, Goal, Row, Side, compare, paired
from bench.harness_bench import (
    DATASET,
    REPO,
    finish_times,
    run_job,
    window_cpu_s,
    window_edges,
)


class Discard:
    """A final step that does nothing, so a pipeline's throughput is that of its step 0."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @staticmethod
    def output_shape(**kwargs: Any) -> None:
        return None

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        return (), non_tensors, time_card


# P6: each replica's first items cost it more CPU than the rest (allocator arenas, caches, torch's first calls: 25 to 40
# items/CPU-s in a job's first windows, 45 to 55 later, at load 2 to 5), so a replica's first WARM_ITEMS are left out;
# the harness samples the loaders' CPU every SAMPLE_MS, so that a window's edges fall within a few ms of CPU.
WARM_ITEMS = 40
SAMPLE_MS = 10


def scaling_pipeline(replicas: int) -> dict[str, Any]:
    """The episode loader on `replicas` CPU runners, then a final step that only counts.

    The loader keeps nothing (a byte budget of 1) and fetches nothing ahead:
    every item reads its episode and opens its decoder, so an item costs the
    same whichever replica reads it and however many items that replica has
    read. With the cache kept, two replicas fill two caches: over the 24
    episodes here a replica's hits grow with the items it has read, and two
    replicas read half as many each.
    """
    return {
        # Generated where missing, as the default config's is: a fresh clone has no data/synthetic until a job writes it.
        "source": {"dataset": str(DATASET), "order": "random", "seed": 0, "generate_if_missing": True},
        "pipeline": [
            {"model": "models.episode.EpisodeLoader", "num_shared_tensors": 4, "byte_budget": 1, "prefetch": 0,
             "queue_groups": [{"gpus": [-1] * replicas, "out_queues": [0]}]},
            {"model": "bench.scaling_bench.Discard", "queue_groups": [{"gpus": [-1], "in_queue": 0}]},
        ],
    }


def loader_windows(job_dir: Path, windows: int, skip: int = 0) -> list[tuple[float, float]]:
    """(items/s, cores the step-0 runners got) in each of `windows` slices of a job's timed window.

    The cores are the loaders' CPU seconds in the slice (window_cpu_s, summed
    over the replicas) over its wall seconds. The slices start once the
    first `skip` items have finished.
    """
    meta = json.loads((job_dir / "meta.json").read_text(encoding="utf-8"))
    finishes = finish_times(job_dir, meta["num_steps"])
    edges, counts = window_edges(finishes[skip - 1] if skip else meta["start_time"], finishes[skip:], windows)
    loaders = {p["name"] for p in meta["processes"] if p["role"] == "runner" and p["step"] == 0}
    spent = window_cpu_s(job_dir, edges, loaders)
    if min(spent) <= 0:
        raise RuntimeError(f"{job_dir}: no CPU time sampled for the loaders ({', '.join(sorted(loaders))}) "
                           f"in window {spent.index(min(spent)) + 1} of {windows}")
    return [(count / (end - begin), cpu / (end - begin))
            for begin, end, count, cpu in zip(edges, edges[1:], counts, spent)]


def p6_scaling(effort: Effort) -> list[Row]:
    """2 loader replicas / 1, and the same per core the loaders got (P6c), which is what bounds P6 here.

    On two cores shared with the main process, the client and the final
    step, two replicas cannot get two cores; the cores they did get (against
    one replica's) are P6's bound, measured in the same windows. Each
    repetition is a job of either side, the sides alternating (AB, BA, ...),
    timed over its items after each replica's first WARM_ITEMS: a loader's
    CPU per item moves with what else the machine runs, so the sides are
    measured close together in time and each over the same stretch of its
    replicas' lives.
    """
    measured = effort.pick(60, 120)
    two: list[tuple[float, float]] = []
    one: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="rnb-P6-") as tmp:
        def side(replicas: int, into: list[tuple[float, float]]) -> Callable[[], float]:
            def measure() -> float:
                job_dir = run_job(scaling_pipeline(replicas), replicas * WARM_ITEMS + measured, Path(tmp),
                                  extra=("--sample-interval-ms", str(SAMPLE_MS)))
                into.extend(loader_windows(job_dir, 1, skip=replicas * WARM_ITEMS))
                return into[-1][0]
            return measure

        paired(side(2, two), side(1, one), effort.reps, warmup=0)
    cores_two, cores_one = statistics.median(c for _, c in two), statistics.median(c for _, c in one)
    note = (f"EpisodeLoader over {DATASET.relative_to(REPO)}, nothing kept or fetched ahead, final step discards; "
            f"{effort.reps} jobs per side, alternating, each timed over {measured} items after each replica's first "
            f"{WARM_ITEMS}, CPU sampled every {SAMPLE_MS} ms. Bound: the loaders got {cores_two:.2f} cores with 2 "
            f"replicas and {cores_one:.2f} with 1 (medians), {cores_two / cores_one:.2f}x")
    return [
        compare("P6", "2 CPU loader replicas / 1 replica (2-core machine)", Goal(">=", 1.8),
                Side.of("2 replicas", "items/s", [r for r, _ in two]), Side.of("1 replica", "items/s", [r for r, _ in one]),
                note),
        compare("P6c", "P6 against its bound: items per loader CPU-second, 2 replicas / 1", Goal(">=", 0.95),
                Side.of("2 replicas", "items/CPU-s", [r / c for r, c in two]),
                Side.of("1 replica", "items/CPU-s", [r / c for r, c in one])),
    ]
