"""T3/T3c: the estimator's predictions against jobs measured, on the sleeping example's grid and on the CPU
example's replica counts: bulk throughput, and the p99 under the job's own Poisson arrivals."""
from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path

from bench.common import Effort, Goal, Row, Side
from bench.tune_bench import (
    CPU_EXAMPLE,
    EXAMPLE,
    REPO,
    profiled,
)
from rnb.analysis.job_columns import JobRow
from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import ValidityRules, summarize_job
from rnb.analysis.sweep import run_benchmark
from rnb.load import logged_seed, logged_settings
from rnb.tune.sim_records import Arrivals
from rnb.tune.space import Candidate

T3_CONFIGS = 8

# T3c's configs of the CPU example: replica counts from 1 to more than this machine's 2 cores.
T3C_REPLICAS: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (4, 2))

def t3(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    """Predicted against measured on the sleeping example: configs spread over its grid."""
    space, _ = profiled(config, "local", effort.quick)
    grid = list(space.grid())
    picked = [grid[round(i * (len(grid) - 1) / (T3_CONFIGS - 1))] for i in range(T3_CONFIGS)]
    return estimator_rows(("T3", "T3p"), config, picked, effort)


def t3c(effort: Effort) -> list[Row]:
    """Predicted against measured on the CPU example: replica counts from 1 to more than the cores."""
    space, _ = profiled(CPU_EXAMPLE, "local", effort.quick)
    picked = [space.candidate({(0, 0): loaders, (1, 0): networks}, {}) for loaders, networks in T3C_REPLICAS]
    return estimator_rows(("T3c", "T3cp"), CPU_EXAMPLE, picked, effort)


def estimator_rows(ids: tuple[str, str], config: Path, picked: list[Candidate], effort: Effort) -> list[Row]:
    """Predicted against measured, per config: bulk throughput, and the p99 at 70% of the measured bulk rate."""
    space, estimator = profiled(config, "local", effort.quick)
    work = Path(tempfile.mkdtemp(prefix=f"rnb-{ids[0]}-"))
    throughput_errors, latency_errors, details = [], [], []
    rules = ValidityRules()
    with open(work / "t3.log", "a", encoding="utf-8") as output:
        for index, candidate in enumerate(picked):
            path = work / f"config-{index}.json"
            path.write_text(json.dumps(space.document_for(candidate)))
            videos = 600 if effort.quick else 1500
            bulk = run_benchmark(str(path), 0.0, work / "logs", ["-v", str(videos), "--warmup", "0"], output=output)
            measured = _number(summarize_job(read_job(bulk.job_dir), rules), "measured_throughput_items_per_s")
            # predicted as the job ran: as many items, none left out as warm-up
            predicted = estimator.at(candidate, Arrivals("bulk"), videos, warmup=0)
            throughput_errors.append(abs(predicted.throughput_items_per_s - measured) / measured)
            rate = 0.7 * measured
            count = max(500, math.ceil(rate * 3))
            poisson = run_benchmark(str(path), 1000.0 / rate, work / "logs", ["-v", str(count), "--warmup", "20"],
                                    output=output)
            measured_job = read_job(poisson.job_dir)
            measured_p99 = _number(summarize_job(measured_job, rules), "e2e_p99_ms")
            predicted_p99 = estimator.at(candidate, job_arrivals(measured_job.meta.args, count), count,
                                         warmup=20).latency_ms[99.0]
            latency_errors.append(abs(predicted_p99 - measured_p99) / measured_p99)
            details.append(f"{space.short_label(candidate)}: {predicted.throughput_items_per_s:.0f} vs {measured:.0f} "
                           f"items/s, p99 {predicted_p99:.0f} vs {measured_p99:.0f} ms")
    note = "; ".join(details)
    name = config.relative_to(REPO) if config.is_relative_to(REPO) else config
    return [
        Row(ids[0], f"estimator error: median over {len(picked)} configs of {name} of |predicted - measured| / "
                    "measured bulk throughput", Goal("<=", 0.10),
            Side.of("error", "fraction", throughput_errors), None, statistics.median(throughput_errors),
            min(throughput_errors), max(throughput_errors), len(throughput_errors), note=f"predicted vs measured: {note}"),
        Row(ids[1], "estimator error of the p99 latency at 70% of the measured bulk rate (median over the same configs)",
            Goal("<=", 0.25), Side.of("error", "fraction", latency_errors), None, statistics.median(latency_errors),
            min(latency_errors), max(latency_errors), len(latency_errors)),
    ]


def job_arrivals(args: Mapping[str, object], items: int) -> Arrivals:
    """The arrivals a logged job's client offered (its load and seed, from meta.json's `args`).

    The p99 of the few hundred items of a row's Poisson job depends on its
    draw of arrivals as much as on the model: over ten draws of the
    estimator's own, one config's predicted p99 ranged from 33 to 62 ms
    (docs/tuner.md, Phase 2).  Offering the job's own draw
    leaves the model's error.
    """
    return Arrivals.of_load(logged_settings(args), logged_seed(args), items)


def _number(row: JobRow, column: str) -> float:
    """A number of a jobs-table row; a job that measured none has no error to report."""
    value = row.get(column)
    if not isinstance(value, (int, float)):
        raise RuntimeError(f"{row.get('job_dir')}: the job measured no {column}")
    return float(value)
