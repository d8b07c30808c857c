"""Busy fractions, the bottleneck and the report's new lines on a hand-made job; plot colours and load curves."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rnb.analysis.jobs import load_jobs, read_job
from rnb.analysis.report import format_utilisation, load_curves, stage_colours
from rnb.analysis.utilisation import bottleneck, busy_fractions, union_seconds
from rnb.core.stages import PARTS
from tests.shared_jobs import bulk_toy_job
from tests.test_trace import handmade, run_analyze  # noqa: F401  (the fixture is used by name)


def test_union_counts_overlapping_intervals_once() -> None:
    assert union_seconds(np.array([5.0, 0.0, 1.0, 8.0]), np.array([7.0, 2.0, 3.0, 8.5])) == 5.5


def test_busy_fractions_union_each_runners_inside_time(handmade: Path) -> None:
    job = read_job(handmade)
    busy = busy_fractions(job)
    # 30 ms elapsed; the loader is inside 3+3+2 ms; the CPU network holds items 0 and 2 over 11-24 ms.
    assert busy == pytest.approx({"step0-g0-r0": 8 / 30, "step1-g0-r0": 13 / 30, "step1-g0-r1": 3.4 / 30})
    neck = bottleneck(job, busy)
    assert (neck.step, neck.runners) == (1, ("step1-g0-r0", "step1-g0-r1"))
    assert neck.busy == pytest.approx(16.4 / 60)   # above the loader's 16 / 60


def test_the_report_names_each_runners_busy_fraction_and_the_bottleneck(handmade: Path) -> None:
    done = run_analyze(str(handmade), "--min-items", "1", "--min-duration", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "runners (time inside the model / elapsed): step0-g0-r0 busy 27%; step1-g0-r0 busy 43%; " \
           "step1-g0-r1 busy 11%" in lines
    assert "bottleneck: step 1 (its runners busy 27% of the elapsed time on average)" in lines
    # Items finish at 19, 21 and 25 ms: windows of 10 ms hold 0, 1 and 2; only the median window is steady.
    assert "throughput over 3 windows of 0.01 s; steady state: 0.01-0.02 s at 100 items/s" in lines
    # End to end 18, 20 and 23 ms: three items bound the upper percentiles from below (by the fastest) only.
    assert ("end-to-end ms with 95% confidence intervals from order statistics: p50 20 [-, -]; p90 22.4 [18, -]; "
            "p95 22.7 [20, -]; p99 22.9 [20, -]; p99.9 23 [23, -]") in lines
    row = load_jobs(handmade).jobs.to_pylist()[0]
    assert json.loads(row["throughput_windows"]) == pytest.approx([0.0, 100.0, 200.0])
    assert row["invalid_because"].endswith("3 items cannot bound the p99 from above at 95% confidence, "
                                           "which takes at least 368 (0.99^n <= 0.025).")


def test_stage_colours_are_distinct_for_any_number_of_steps() -> None:
    for steps in range(1, 9):
        colours = stage_colours(steps)
        assert len(colours) == len(set(colours)) == len(PARTS) * steps


def test_closed_loop_jobs_make_a_curve_of_their_own_ordered_by_concurrency() -> None:
    def job(mi: float | None, concurrency: int | None, throughput: float) -> dict:
        return {"config_path": "config/toy.json", "mean_interval_ms": mi, "concurrency": concurrency,
                "measured_throughput_items_per_s": throughput, "e2e_p99_ms": throughput / 10}

    jobs = pa.Table.from_pylist([job(None, 8, 80.0), job(5.0, None, 50.0), job(None, 2, 20.0), job(0.0, None, 90.0),
                                 job(20.0, None, 10.0)])
    assert load_curves(jobs) == {
        "toy.json": [("mi 20", 10.0, 1.0), ("mi 5", 50.0, 5.0), ("mi 0", 90.0, 9.0)],
        "toy.json (closed loop)": [("c 2", 20.0, 2.0), ("c 8", 80.0, 8.0)],
    }
    assert "steady state" not in format_utilisation({"busy_fraction": "{}"})


def test_the_end_of_run_summary_names_each_runners_busy_fraction_and_the_bottleneck(tmp_path_factory, job_log) -> None:
    shared = bulk_toy_job(tmp_path_factory.getbasetemp())   # sampled every 10 ms
    assert shared.done.returncode == 0, shared.done.stderr
    log = job_log(shared.log_dir)
    start, end = log.meta["start_time"], log.meta["end_time"]
    # One replica per step runs its items one at a time, so its inside intervals do not overlap.
    busy = [sum(min(row[f"inference{k}_finish"], end) - max(row[f"inference{k}_start"], start) for row in log.rows)
            / (end - start) for k in range(2)]
    lines = shared.done.stdout.splitlines()
    (runners,) = [line for line in lines if line.startswith("runners (time inside the model / elapsed): ")]
    cpu = re.fullmatch(r"runners \(time inside the model / elapsed\): step0-g0-r0 busy (\d+)%(?:, cpu (\d+)%)?; "
                       r"step1-g0-r0 busy (\d+)%(?:, cpu (\d+)%)?", runners)
    assert cpu, runners
    assert [int(cpu[1]), int(cpu[3])] == [round(100 * b) for b in busy]
    # A CPU share needs two samples of the runner between start and end, which a loaded machine may not take.
    samples = pq.read_table(log.dir / "samples.parquet").to_pylist()
    sampled = [sum(s["process"] == f"step{k}-g0-r0" and start <= s["time"] <= end for s in samples) >= 2
               for k in range(2)]
    assert [cpu[i] is not None for i in (2, 4)] == sampled
    assert all(0 <= int(cpu[i]) <= 100 * len(os.sched_getaffinity(0)) for i in (2, 4) if cpu[i] is not None)
    neck = max(range(2), key=lambda k: busy[k])
    after = lines[lines.index(runners) + 1]
    assert after == f"bottleneck: step {neck} (its runners busy {busy[neck]:.0%} of the elapsed time on average)"
    assert lines[0] == "termination: target reached" and lines[-1] == f"job log: {log.dir}"
