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

from rnb import cli
from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import load_jobs
from rnb.analysis.plots import stage_colours
from rnb.analysis.report import format_utilisation, load_curves
from rnb.analysis.utilisation import CPU_SHARE_MIN_SPAN_S, busiest_step, busy_fractions, cpu_percent, union_seconds
from rnb.core.stages import PARTS
from tests.support.handmade_job import process, run_analyze, step_times, write_job
from tests.support.shared_jobs import bulk_toy_job


def test_union_counts_overlapping_intervals_once() -> None:
    assert union_seconds(np.array([5.0, 0.0, 1.0, 8.0]), np.array([7.0, 2.0, 3.0, 8.5])) == 5.5


def test_a_cpu_share_is_read_only_over_a_span_its_clock_ticks_can_resolve() -> None:
    tick = CPU_SHARE_MIN_SPAN_S / 10
    # Two samples 10 ms apart whose counts differ by three ticks: 300% of a core, a quantisation artefact.
    short = [{"time": 100.0, "process": "step0-g0-r0", "cpu_s": 5.0},
             {"time": 100.01, "process": "step0-g0-r0", "cpu_s": 5.0 + 3 * tick}]
    # Samples a second apart, half a second of CPU between them.
    long = [{"time": 100.0 + 0.1 * i, "process": "step1-g0-r0", "cpu_s": 2.0 + 0.05 * i} for i in range(11)]
    samples = pa.Table.from_pylist(short + long)
    assert cpu_percent(samples, 99.0, 102.0) == {"step1-g0-r0": pytest.approx(50.0)}
    assert cpu_percent(samples, 100.0, 100.05) == {}   # each process's samples there span less than ten ticks


def test_busy_fractions_union_each_runners_inside_time(handmade: Path) -> None:
    job = read_job(handmade)
    busy = busy_fractions(job)
    # 30 ms elapsed; the loader is inside 3+3+2 ms; the CPU network holds items 0 and 2 over 11-24 ms.
    assert busy == pytest.approx({"step0-g0-r0": 8 / 30, "step1-g0-r0": 13 / 30, "step1-g0-r1": 3.4 / 30})
    neck = busiest_step(job, busy)
    assert (neck.step, neck.runners) == (1, ("step1-g0-r0", "step1-g0-r1"))
    assert neck.busy == pytest.approx(16.4 / 60)   # above the loader's 16 / 60
    assert not neck.saturated


def test_the_report_names_each_runners_busy_fraction_and_the_bottleneck(handmade: Path) -> None:
    done = run_analyze(str(handmade), "--min-items", "1", "--min-duration", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "runners (time inside the model / elapsed): step0-g0-r0 busy 27%; step1-g0-r0 busy 43%; " \
           "step1-g0-r1 busy 11%" in lines
    # Busy 27% of the time, step 1 could take more: the offered load, not a step, bounded the throughput.
    assert ("bottleneck: no step was saturated: the pipeline served the offered load (the busiest, step 1, "
            "27% of the elapsed time on average)") in lines
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
    def job(mi: float | None, concurrency: int | None, throughput: float, validity: str = "VALID") -> dict:
        return {"config_path": "config/toy.json", "mean_interval_ms": mi, "concurrency": concurrency,
                "measured_throughput_items_per_s": throughput, "e2e_p99_ms": throughput / 10, "validity": validity}

    jobs = pa.Table.from_pylist([job(None, 8, 80.0), job(5.0, None, 50.0), job(None, 2, 20.0), job(0.0, None, 90.0),
                                 job(20.0, None, 10.0, "INVALID")])
    assert load_curves(jobs) == {
        "toy.json": [("mi 20", 10.0, 1.0, False), ("mi 5", 50.0, 5.0, True), ("mi 0", 90.0, 9.0, True)],
        "toy.json (closed loop)": [("c 2", 20.0, 2.0, True), ("c 8", 80.0, 8.0, True)],
    }
    assert "steady state" not in format_utilisation({"busy_fraction": "{}"})
    streams = [{"config_path": "config/streams-example.json", "streams": n, "fps": 30.0, "stream_policy": policy,
                "measured_throughput_items_per_s": 30.0 * n, "e2e_p99_ms": 20.0 * n, "validity": "VALID"}
               for policy in ("queue", "drop") for n in (1, 2)]
    assert sorted(load_curves(pa.Table.from_pylist(streams))) == [
        "streams-example.json (streams at 30 fps, drop)", "streams-example.json (streams at 30 fps, queue)"]


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
    cpu = re.fullmatch(r"runners \(time inside the model / elapsed\): step0-g0-r0 busy (\d+)%(?:, cpu (\d+)%)?"
                       r"(?:, waited for a core (\d+)%)?; step1-g0-r0 busy (\d+)%(?:, cpu (\d+)%)?"
                       r"(?:, waited for a core (\d+)%)?", runners)
    assert cpu, runners
    assert [int(cpu[1]), int(cpu[4])] == [round(100 * b) for b in busy]
    # A CPU share needs samples of the runner between start and end ten clock ticks apart or more, which a short job
    # on a loaded machine may not take.
    samples = pq.read_table(log.dir / "samples.parquet").to_pylist()
    times = [[s["time"] for s in samples if s["process"] == f"step{k}-g0-r0" and start <= s["time"] <= end]
             for k in range(2)]
    sampled = [len(t) >= 2 and max(t) - min(t) >= CPU_SHARE_MIN_SPAN_S for t in times]
    assert [cpu[i] is not None for i in (2, 5)] == sampled
    assert all(0 <= int(cpu[i]) <= 100 * len(os.sched_getaffinity(0)) for i in (2, 5) if cpu[i] is not None)
    # A runner that waited for a core a tenth of the time or more says how long (the host's load decides whether).
    assert all(10 <= int(cpu[i]) <= 100 for i in (3, 6) if cpu[i] is not None)
    neck = max(range(2), key=lambda k: busy[k])
    waited = cpu[3 if neck == 0 else 6]
    waiting = f", waiting for a core {waited}% of it" if waited else ""
    after = lines[lines.index(runners) + 1]
    if busy[neck] >= 0.8:
        assert after == f"bottleneck: step {neck} (its runners busy {busy[neck]:.0%} of the elapsed time on average)"
    else:   # -mi 0 queued every request at once, yet a loaded machine may keep both models under 80% busy
        assert after == ("bottleneck: no step was saturated, though every request was sent at once: the time between "
                         f"the models (queues, copies, hand-overs) bounds it (the busiest, step {neck}, {busy[neck]:.0%} "
                         f"of the elapsed time on average{waiting})")
    assert lines[0] == "termination: target reached" and lines[-1] == f"job log: {log.dir}"


@pytest.fixture()
def batched(tmp_path: Path) -> Path:
    """A loader, a Batcher of 2 and a network, 30 ms: items 0 and 1 fill a batch, item 2 is flushed alone.

    The Batcher holds item 0 from 1 to 2.5 ms; item 1's call (2-2.5 ms) completes the batch.  Item 2
    arrives at 4 ms, the input stays idle, and the flush that begins at 9 ms hands it over at 9.5 ms.
    The network runs the batch over 3-17 ms and item 2 over 17-29 ms: busy 26 ms of 30.
    """
    config = {"pipeline": [
        {"model": "m.Loader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "models.batcher.Batcher", "batch": 2, "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
        {"model": "m.Net", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
    processes = [process("client", "client", None, None, None, None)] + [
        process(f"step{k}-g0-r0", "runner", k, 0, 0, "cpu") for k in range(3)]
    rows = [
        {"item_id": 0, "enqueue": 0.2, **step_times(0, 0.2, 0.2, 0.7, 1.0), **step_times(1, 1.0, 1.0, 2.5, 2.8),
         **step_times(2, 3.0, 3.0, 17.0, 17.5)},
        {"item_id": 1, "enqueue": 1.0, **step_times(0, 1.0, 1.0, 1.5, 2.0), **step_times(1, 2.0, 2.0, 2.5, 2.8),
         **step_times(2, 3.0, 3.0, 17.0, 17.5)},
        {"item_id": 2, "enqueue": 3.0, **step_times(0, 3.0, 3.0, 3.5, 4.0), **step_times(1, 4.0, 4.0, 9.5, 10.0),
         "flush1": 9.0, **step_times(2, 10.0, 17.0, 29.0, 29.5)},
    ]
    return write_job(tmp_path / "logs" / "batched", rows, processes, config, num_steps=3)


def test_a_batcher_is_busy_only_for_the_calls_that_hand_its_batches_over(batched: Path) -> None:
    busy = busy_fractions(read_job(batched))
    # Its own work: 2-2.5 ms (the call that completed the batch) and 9-9.5 ms (the flush), not 1-2.5 and 4-9.5.
    assert busy == pytest.approx({"step0-g0-r0": 1.5 / 30, "step1-g0-r0": 1 / 30, "step2-g0-r0": 26 / 30})
    done = run_analyze(str(batched), "--min-items", "1", "--min-duration", "0")
    assert done.returncode == 0, done.stderr
    assert "bottleneck: step 2 (its runners busy 87% of the elapsed time on average)" in done.stdout.splitlines()
    row = load_jobs(batched).jobs.to_pylist()[0]
    assert (row["busiest_step"], row["bottleneck_step"]) == (2, 2)


def test_a_log_without_flush_stamps_counts_a_flushed_batch_from_its_last_items_call(batched: Path) -> None:
    timings = pq.read_table(batched / "timings.parquet")
    pq.write_table(timings.drop_columns(["flush1"]), batched / "timings.parquet")
    # Written before flushes were stamped: item 2's batch counts from its own call (4 ms) to its hand-over.
    assert busy_fractions(read_job(batched))["step1-g0-r0"] == pytest.approx((0.5 + 5.5) / 30)


def test_a_batch_handed_over_by_a_flush_carries_when_the_flush_began(tmp_path, job_log) -> None:
    config = tmp_path / "batched.json"
    config.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "models.batcher.Batcher", "batch": 3, "timeout_ms": 200,
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}))
    assert cli.main(["-c", str(config), "-v", "4", "-mi", "0", "--warmup", "0", "--log-dir", str(tmp_path)]) == 0
    rows = job_log(tmp_path).rows
    batches: dict[int, list[dict]] = {}
    for row in rows:
        batches.setdefault(row["batch1"], []).append(row)
    # However the machine spaced the items, a full batch left from a call and a partial one from a flush.
    assert any(len(items) < 3 for items in batches.values())
    for items in batches.values():
        flushed = {row.get("flush1") is not None for row in items}
        assert flushed == {len(items) < 3}
        for row in items:
            if row.get("flush1") is not None:
                assert max(r["inference1_start"] for r in items) <= row["flush1"] <= row["inference1_finish"]


def test_the_plots_stage_bars_stand_side_by_side_on_a_log_axis_when_a_hundredfold_apart() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from rnb.analysis.plots import _stage_bars

    near = {"job_id": "near", "num_steps": 2, "copy0_mean_ms": 30.0, "inside0_mean_ms": 200.0, "inside1_mean_ms": 400.0}
    far = {**near, "job_id": "far", "copy0_mean_ms": 0.3, "inside1_mean_ms": 800.0}
    for records, scale, bottoms in (([near], "linear", {0.0, 30.0, 230.0}), ([near, far], "log", {0.0})):
        axis = Figure().add_subplot()
        _stage_bars(axis, records, [str(record["job_id"]) for record in records])
        assert axis.get_yscale() == scale
        # Stacked, each part starts where the one before ended; side by side, every bar starts at 0.
        assert {round(bar.get_y(), 6) for bar in axis.patches if bar.get_height() > 0} == bottoms
