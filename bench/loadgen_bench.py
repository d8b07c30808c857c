"""L1, L2, L3: RnB measured as the reference measures, MLPerf LoadGen, on the same work side by side.

One pipeline throughout: one step of 10 ms of sleeping (models.toy.SyncSleep,
the plainest step there is) on 2 CPU replicas, so 200 items/s at most.

- L1: the pipeline driven by RnB's client / by LoadGen (`--client loadgen`).
  Server at 0.5 and 0.8 of capacity: RnB's client replays the issue times of
  the LoadGen job it is paired with (`--arrivals`), so both offer the same
  arrivals and differ only in who drives and who measures: p50 and p99 (RnB's
  from its time cards, LoadGen's from its log) within 5 %.  Offline: samples
  per second, each by its own count, at least 0.98.
- L2: the pipeline under LoadGen / LoadGen's plainest in-process system under
  test doing the same work (bench.loadgen_sut): RnB's whole cost against
  the floor a harness can reach.  Offline samples/s at least 0.97, Server's
  p50 at 0.8 of capacity at most 1.10, SingleStream's p90 at most 0.3 ms
  above (a difference in ms, not a ratio).
- L3: a corpus of runs of known kind per scenario (too short, overloaded,
  latency bound broken, early stopping short, enough), each driven by
  LoadGen: RnB's verdict by LoadGen's rules, read from the time cards, must
  be LoadGen's own, rule by rule, on every one.
"""
from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench.bounded import isolated
from bench.common import Effort, Goal, Row, Side, compare
from bench.harness_bench import run_job
from bench.loadgen_sut import plain_sut
from rnb.analysis.loadgen_log import read_detail
from rnb.analysis.loadgen_rules import loadgen_percentile
from rnb.analysis.verdict import issue_times
from rnb.core.records import Json
from rnb.core.stages import StepEvents, event_seconds
from rnb.load import LoadSettings

STEP_MS = 10.0
REPLICAS = 2
CAPACITY = REPLICAS * 1000.0 / STEP_MS   # items/s
LOADS = (0.5, 0.8)                      # Server's rates, as fractions of capacity
MIN_DURATION_MS = 1000                  # the figure rows compare figures, not verdicts: any length will do
SUT_S = 600.0                           # the most one plain-SUT test may take


def pipeline(step_ms: float = STEP_MS, replicas: int = REPLICAS) -> dict[str, Any]:
    return {"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyncSleep", "ms": step_ms, "queue_groups": [{"gpus": [-1] * replicas}]}]}


@dataclass(frozen=True)
class Figures:
    """What one run reports: latency percentiles (ms, LoadGen's order statistic) and samples per second."""

    p50: float
    p90: float
    p99: float
    per_s: float


def rnb_figures(job_dir: Path) -> Figures:
    """RnB's own figures from its time cards, as its scenario verdict reads them: each item from its issue (its due
    time) to its final hand-over."""
    timings = pq.read_table(job_dir / "timings.parquet")
    issued, finished = issue_times(timings), event_seconds(timings, StepEvents(0).handed_over)
    took = finished - issued
    p50, p90, p99 = (loadgen_percentile(took, p) * 1000 for p in (0.5, 0.9, 0.99))
    return Figures(p50, p90, p99, took.size / float(np.max(finished) - np.min(issued)))


def loadgen_figures(detail: dict[str, Json]) -> Figures:
    """LoadGen's own figures from its detail log."""
    def ms(percentile: str) -> float:
        return float(detail[f"result_{percentile}_percentile_latency_ns"]) / 1e6   # type: ignore[arg-type]
    rate = detail.get("result_samples_per_second", detail.get("result_completed_samples_per_sec"))
    return Figures(ms("50.00"), ms("90.00"), ms("99.00"), float(rate) if isinstance(rate, (int, float)) else 0.0)


@dataclass
class Runs:
    """Each side's figures, repetition by repetition, keyed by what was run."""

    figures: dict[str, list[Figures]] = field(default_factory=dict)

    def add(self, key: str, figures: Figures) -> None:
        self.figures.setdefault(key, []).append(figures)

    def side(self, key: str, label: str, unit: str, pick: Callable[[Figures], float]) -> Side:
        return Side.of(label, unit, [pick(f) for f in self.figures[key]])


def loadgen_job(workdir: Path, scenario: str, videos: int, extra: Sequence[str] = ()) -> Path:
    """The pipeline with LoadGen as its client; its job directory (LoadGen's logs inside)."""
    return run_job(pipeline(), videos, workdir, load=("--scenario", scenario, "--client", "loadgen", *extra,
                                                      "--min-duration-ms", str(MIN_DURATION_MS)))


def sut(workdir: Path, scenario: str, videos: int, mean_interval_ms: float = 3.0) -> Figures:
    """LoadGen's plain SUT on the same settings, in a process of its own."""
    load = LoadSettings(scenario=scenario, client="loadgen", mean_interval_ms=mean_interval_ms,
                        min_duration_ms=MIN_DURATION_MS)
    outdir = tempfile.mkdtemp(dir=workdir, prefix="sut-")
    return loadgen_figures(isolated(plain_sut, load, videos, 0, STEP_MS, REPLICAS, outdir, own_s=SUT_S))


def measure(effort: Effort, workdir: Path) -> Runs:
    """Every run L1 and L2 compare, in repetitions whose order alternates."""
    runs = Runs()
    server_n, offline_n, single_n = effort.pick(1200, 3000), effort.pick(1000, 3000), effort.pick(300, 1000)

    def server(load: float) -> None:
        interval = f"{1000.0 / (load * CAPACITY):g}"
        driven = loadgen_job(workdir, "server", server_n, ("-mi", interval))
        runs.add(f"lg server {load}", loadgen_figures(read_detail(driven) or {}))
        replay = run_job(pipeline(), server_n, workdir, load=("--scenario", "server", "--arrivals", str(driven)))
        runs.add(f"rnb server {load}", rnb_figures(replay))
        if load == max(LOADS):
            runs.add("sut server", sut(workdir, "server", server_n, float(interval)))

    def offline() -> None:
        runs.add("lg offline", loadgen_figures(read_detail(loadgen_job(workdir, "offline", offline_n)) or {}))
        runs.add("rnb offline", rnb_figures(run_job(pipeline(), offline_n, workdir, load=("--scenario", "offline"))))
        runs.add("sut offline", sut(workdir, "offline", offline_n))

    def single() -> None:
        driven = loadgen_job(workdir, "single-stream", single_n, ("--target-latency-ms", f"{STEP_MS:g}"))
        runs.add("lg single", loadgen_figures(read_detail(driven) or {}))
        runs.add("sut single", sut(workdir, "single-stream", single_n))

    tasks = [lambda: server(LOADS[0]), lambda: server(LOADS[1]), offline, single]
    for rep in range(effort.reps):
        for task in tasks if rep % 2 == 0 else reversed(tasks):
            task()
    return runs


def l1_rows(runs: Runs) -> list[Row]:
    rows = []
    for load in LOADS:
        rate = f"{load * CAPACITY:g}/s"
        for stat, pick in (("p50", lambda f: f.p50), ("p99", lambda f: f.p99)):
            ident = f"L1s{load * 100:.0f}{'' if stat == 'p50' else 't'}"
            rows.append(compare(ident, f"Server at {load:g} of capacity ({rate}): {stat} driven by RnB's client / by "
                                f"LoadGen, each its own figure", Goal("within", 0.05),
                                runs.side(f"rnb server {load}", "RnB's client", "ms", pick),
                                runs.side(f"lg server {load}", "LoadGen", "ms", pick),
                                note=f"{_PIPELINE}; RnB's client replays the issue times of the LoadGen job it is "
                                     "paired with (--arrivals), so both offer the same arrivals; percentiles as "
                                     "LoadGen takes them (the sorted latencies' element floor(n p))"))
    rows.append(compare("L1o", "Offline samples/s: driven by RnB's client / by LoadGen, each its own count",
                        Goal(">=", 0.98), runs.side("rnb offline", "RnB's client", "samples/s", lambda f: f.per_s),
                        runs.side("lg offline", "LoadGen", "samples/s", lambda f: f.per_s), note=_PIPELINE))
    return rows


def l2_rows(runs: Runs) -> list[Row]:
    floor = "B: LoadGen's plainest in-process SUT, 2 threads that sleep 10 ms and complete (bench/loadgen_sut.py)"
    a = runs.side("lg single", "RnB under LoadGen", "ms", lambda f: f.p90)
    b = runs.side("sut single", "plain SUT", "ms", lambda f: f.p90)
    above = [x - y for x, y in zip(a.values, b.values)]
    return [
        compare("L2o", "Offline samples/s: the RnB pipeline under LoadGen / LoadGen's plain SUT of the same work",
                Goal(">=", 0.97), runs.side("lg offline", "RnB under LoadGen", "samples/s", lambda f: f.per_s),
                runs.side("sut offline", "plain SUT", "samples/s", lambda f: f.per_s), note=f"{_PIPELINE}; {floor}"),
        compare("L2s", f"Server p50 at {max(LOADS):g} of capacity: the RnB pipeline under LoadGen / the plain SUT",
                Goal("<=", 1.10), runs.side(f"lg server {max(LOADS)}", "RnB under LoadGen", "ms", lambda f: f.p50),
                runs.side("sut server", "plain SUT", "ms", lambda f: f.p50), note=f"{_PIPELINE}; {floor}"),
        Row("L2ss", "SingleStream p90: the RnB pipeline under LoadGen minus the plain SUT; the figure is in ms, not a "
                    "ratio", Goal("<=", 0.3), a, b, statistics.median(above), min(above), max(above), len(above),
            note=f"{_PIPELINE}; {floor}; each side's p90 from LoadGen's own log"),
    ]


_PIPELINE = (f"one step of models.toy.SyncSleep ({STEP_MS:g} ms) on {REPLICAS} CPU replicas, {CAPACITY:g} items/s "
             "at most")
