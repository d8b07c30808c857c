"""P9/P9n/P9h: P1's sleeping chain and per-hop cost on the Ray engine, on one node and across two."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Effort, Goal, Row, Side, paired
from bench.harness_bench import (
    CHAIN_STEPS,
    SLEEP_MS,
    chain_pipeline,
    harness_pair,
    loop_throughput,
    per_hop_us,
    run_harness,
)


def on_ray(config: dict[str, Any]) -> dict[str, Any]:
    """The same config on the Ray engine: a one-node Ray on this machine that each job starts and stops."""
    return {**config, "run": {**config.get("run", {}), "engine": "ray"}}


def on_two_nodes(config: dict[str, Any]) -> dict[str, Any]:
    """The same config on a simulated Ray cluster the job starts (rnb.engines.ray.cluster): step 0's runners on
    a node labelled loaders, every later step's on one labelled nets, the client on the head node."""
    pipeline = [{**step, "queue_groups": [{**group, "node": "loaders" if k == 0 else "nets"}
                                          for group in step["queue_groups"]]}
                for k, step in enumerate(config["pipeline"])]
    return on_ray({**config, "pipeline": pipeline})


def p9_ray_sleeping_steps(effort: Effort) -> list[Row]:
    """P9: P1s's pipeline of sleeping steps on the Ray engine, against the slowest step alone; P9n across two nodes."""
    step = ("bench.harness_bench.Idle", {"sleep_ms": SLEEP_MS})
    config, items = chain_pipeline((step,) * CHAIN_STEPS, -1), effort.pick(500, 600)
    what = f"{CHAIN_STEPS}-step pipeline of {SLEEP_MS:g} ms waits on the Ray engine"
    runners = f"{CHAIN_STEPS} CPU runner actors, each sleeping {SLEEP_MS:g} ms per item"
    loop = ("loop", lambda n: loop_throughput((step,), "cpu", n))
    return [harness_pair(effort, "P9", f"{what}: bulk / the slowest step alone in a loop", Goal(">=", 0.95),
                         ("ray", on_ray(config)), loop, items,
                         f"{runners} on a one-node Ray the job starts; the loop runs one such step in this process; "
                         "the local engine's figure is P1s"),
            harness_pair(effort, "P9n", f"{what} across two simulated nodes: bulk / the slowest step alone in a loop",
                         None, ("ray, 2 nodes", on_two_nodes(config)), loop, items,
                         f"{runners}, step 0 on a node labelled loaders and steps 1-{CHAIN_STEPS - 1} on one labelled "
                         "nets, of a simulated cluster the job starts on this machine (a head node for the driver, "
                         "the client and the JobControl, one node per label): the client's and step 0's hand-offs "
                         "cross nodes, through each node's own object store")]


def p9_ray_per_hop(effort: Effort) -> list[Row]:
    """P9h: harness cost per item per hop on the Ray engine, next to the local engine's on the same pipeline."""
    items = effort.pick(1000, 2000)
    config = chain_pipeline((("bench.harness_bench.Idle", {}),) * CHAIN_STEPS, -1)
    with tempfile.TemporaryDirectory(prefix="rnb-P9h-") as tmp:
        def hops(engine_config: dict[str, Any], windows: int) -> list[float]:
            return [per_hop_us(rate, CHAIN_STEPS) for rate in run_harness(engine_config, items, Path(tmp), windows)]
        if effort.quick:
            ray_us, local_us = hops(on_ray(config), effort.reps), hops(config, effort.reps)
        else:
            ray_us, local_us = (list(side) for side in paired(lambda: hops(on_ray(config), 1)[0],
                                                              lambda: hops(config, 1)[0], effort.reps, warmup=0))
    a, b = Side.of("ray", "us/item/hop", ray_us), Side.of("local", "us/item/hop", local_us)
    ratios = [x / y for x, y in zip(a.values, b.values)]
    return [Row("P9h", f"us of harness per item per hop on the Ray engine, {CHAIN_STEPS} no-op steps (bulk); "
                       "the figure is in us, not a ratio", None, a, b, a.median, min(a.values), max(a.values),
                len(a.values),
                note=f"{items} items per job through {CHAIN_STEPS} CPU runners of bench.harness_bench.Idle; on Ray "
                     "an actor call (and its reply once taken) per hand-off, carrying every item that waited for it "
                     "while the consumer was backlogged; a slot and a queue message on the local engine (B); per hop "
                     f"Ray costs {statistics.median(ratios):.1f}x the local engine (median of the paired ratios; "
                     "goal <= 5x); "
                     + ("--quick: windows of one job, not interleaved" if effort.quick else "jobs interleaved"))]
