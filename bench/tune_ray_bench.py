"""T4/T4e: T1 on the Ray engine over a simulated two-node cluster, and the estimator's error for the candidate
the tuner chose there."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from bench.common import Effort, Goal, Row, Side
from bench.tune_bench import (
    EXAMPLE,
    RAY_BOUND_MS,
    T4_GOAL,
    T4_QUICK_WITHIN,
    TuneRun,
    t1_row,
    tuned_run,
)
from rnb.engines.ray.cluster import shared_simulated_cluster
from rnb.tune.report import BEST, CANDIDATES

# The Ray variant of the example: loaders on nodes labelled loaders, the rest on nets (a simulated
# two-node cluster on this machine).
RAY_NODES = ("loaders", "nets", "nets", "nets")

def ray_example(work: Path, config: Path = EXAMPLE) -> Path:
    """The example with each step's group on a node label: on Ray without an address, a simulated cluster."""
    document = json.loads(config.read_text())
    for step, node in zip(document["pipeline"], RAY_NODES):
        for group in step["queue_groups"]:
            group["node"] = node
    path = work / "tune-example-ray.json"
    path.write_text(json.dumps(document, indent=1))
    return path


def t4(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    """T1 on Ray, and how far the tuner's prediction of the candidate it chose was from what it then measured.

    Every job of the row, the tuner's and the grid's, runs on one simulated
    cluster started for the row, as on a real cluster: a job that starts its
    own spends some 10 s on it (a third of a verification job here), and
    its first seconds beside a Ray still starting its processes.
    """
    work = Path(tempfile.mkdtemp(prefix="rnb-T4-"))
    ray_config = ray_example(work, config)
    with ray_address_of_every_job(sorted(set(RAY_NODES))):
        ratio = t1_row("T4", "ray", effort, ray_config,
                        f"T1 on the Ray engine under p99 < {RAY_BOUND_MS:g} ms (a simulated two-node cluster: "
                        "loaders / the rest)", Goal(">=", T4_GOAL), T4_QUICK_WITHIN if effort.quick else None, reps=1)
        ratio = dataclasses.replace(ratio, note=ratio.note + "; every job on one simulated cluster started for the row")
    return [ratio, chosen_error_row("T4e", tuned_run("ray", "auto", effort.quick, ray_config, 0))]


@contextlib.contextmanager
def ray_address_of_every_job(labels: list[str]) -> Iterator[str]:
    """A simulated cluster with these node labels, as RAY_ADDRESS (which rnb-tune, benchmark.py and this process's
    hosts_of follow) until the block ends."""
    before = os.environ.get("RAY_ADDRESS")
    with shared_simulated_cluster(labels) as address:
        os.environ["RAY_ADDRESS"] = address
        try:
            yield address
        finally:
            if before is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = before


@dataclass(frozen=True)
class ChosenPeak:
    """The tuner's winner as its candidates table holds it: the peak rate predicted, and the one verified."""

    label: str
    predicted_per_s: float | None      # None: no rate tried met the bound in the simulation
    verified_per_s: float
    failed_above_per_s: float | None    # the lowest rate tried above the verified one (it broke the bound)


def chosen_peak(run: TuneRun) -> ChosenPeak | None:
    """The winner's row of a tuner run's candidates table (the finalist whose config is best.json's); None
    where the run chose nothing."""
    best = run.out / BEST
    if not best.is_file():
        return None
    pipeline = json.loads(best.read_text())["pipeline"]
    for row in pq.read_table(run.out / CANDIDATES).to_pylist():
        if row.get("verified") and json.loads(Path(row["config_path"]).read_text())["pipeline"] == pipeline:
            verified = float(row["measured_peak_rate_per_s"])
            above = [t["rate_per_s"] for t in json.loads(row["verify_trials"]) if t["rate_per_s"] > verified]
            return ChosenPeak(row["short_label"], row["predicted_peak_rate_per_s"], verified, min(above, default=None))
    return None


def chosen_error_row(id: str, run: TuneRun) -> Row:
    """|predicted - verified| / verified peak rate under the bound, of the candidate the tuner chose."""
    what = (f"estimator error for the candidate the tuner chose on Ray: |predicted - verified| / verified peak rate "
            f"under p99 < {RAY_BOUND_MS:g} ms")
    chosen = chosen_peak(run)
    if chosen is None:
        return Row(id, what, Goal("<=", 0.15), note=f"the tuner chose nothing (exit {run.returncode}), so no error")
    if chosen.predicted_per_s is None:
        return Row(id, what, Goal("<=", 0.15), note=(
            f"{chosen.label}: verified at {chosen.verified_per_s:.4g} req/s, predicted to meet the bound at no rate"))
    error = abs(chosen.predicted_per_s - chosen.verified_per_s) / chosen.verified_per_s
    resolution = ("" if chosen.failed_above_per_s is None else
                  f"; the verification's resolution: the bound broke at {chosen.failed_above_per_s:.4g} req/s, "
                  f"{chosen.failed_above_per_s / chosen.verified_per_s - 1:.0%} above")
    return Row(id, what, Goal("<=", 0.15), Side("predicted", "req/s", chosen.predicted_per_s),
               Side("verified", "req/s", chosen.verified_per_s), error, error, error, 1,
               note=f"{chosen.label}: predicted {chosen.predicted_per_s:.4g}, verified {chosen.verified_per_s:.4g} "
                    f"req/s{resolution}")
