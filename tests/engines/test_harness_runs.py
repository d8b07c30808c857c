"""Whole jobs of the toy pipeline: load modes, replicas, segments, --cpu, and the job log they leave."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest

from rnb import cli
from rnb.analysis.jobs import load_jobs
from rnb.analysis.report import format_summary
from rnb.core.stages import part_latencies

SEGMENT_CHAIN = ["runner{k}_start", "inference{k}_start", "inference{k}_finish", "slot{k}_acquired", "runner{k}_finish"]
STEP_COLUMNS = ["runner{k}_start", "inference{k}_start", "inference{k}_finish", "runner{k}_finish", "device{k}"]


@pytest.fixture
def run(job_log):
    """`run(log_dir, *argv)`: the benchmark's exit code, and the log of the job it ran."""
    def run_job(log_dir: Path, *argv: str):
        code = cli.main([*argv, "--log-dir", str(log_dir)])
        return code, job_log(log_dir)
    return run_job


def write_config(tmp_path: Path, document: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize("mode", [["-mi", "0"], ["-mi", "1"], ["--concurrency", "3", "-q"]],
                         ids=["bulk", "poisson", "closed-quiet"])
def test_toy_pipeline_finishes_exactly_the_target(tmp_path, mode, run, capsys):
    capsys.readouterr()
    code, log = run(tmp_path, "-c", "config/toy.json", "-v", "30", "--warmup", "5", *mode)
    live = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("progress:", "start-up:"))]
    meta, rows = log.meta, log.rows
    assert code == 0
    assert meta["termination_reason"] == "target reached" and meta["error"] is None
    assert meta["finished_items"] == 30 and len(rows) == 30
    assert [row["item_id"] for row in rows] == list(range(30))
    assert [row["payload"] for row in rows] == [str(i) for i in range(30)]
    assert [row["is_warmup"] for row in rows] == [True] * 5 + [False] * 25
    for row in rows:
        times = [row["enqueue"]] + [row[c.format(k=k)] for k in range(2) for c in STEP_COLUMNS[:4]]
        assert times == sorted(times) and meta["start_time"] <= row["enqueue"]
        assert (row["device0"], row["device1"], row["frames_decoded"], row["bytes_fetched"]) == ("cpu", "cpu", 8, None)
    assert meta["throughput_items_per_s"] == pytest.approx(30 / (meta["end_time"] - meta["start_time"]))
    assert [(p["name"], p["status"], p["exitcode"]) for p in meta["processes"]] == [
        ("client", "ok", 0), ("step0-g0-r0", "ok", 0), ("step1-g0-r0", "ok", 0)]
    assert all(p["peak_rss_bytes"] > 0 for p in meta["processes"])
    assert {(p["device_process_bytes"], p["device_outside_allocator_bytes"]) for p in meta["processes"]} == {(None, None)}
    share = max(1, len(os.sched_getaffinity(0)) // 2)  # two CPU runners divide the cores
    runners = meta["processes"][1:]
    assert [(p["threads"], p["intra_op_threads"], p["interop_threads"]) for p in runners] == [(share, share, share)] * 2
    # The id names the config and the load: a closed-loop one its concurrency, an open-loop one -mi.
    load = "c3" if "--concurrency" in mode else f"mi{mode[1]}"
    assert re.fullmatch(rf"\d{{6}}_\d{{6}}-toy-{load}-v30", meta["job_id"]), meta["job_id"]
    # stderr is no terminal here: a progress line once start-up completes and a last one at the end; -q: none.
    progress = [line for line in live if line.startswith("progress:")]
    if "-q" in mode:
        assert live == []
    else:
        assert re.fullmatch(r"progress: \d+ of 30 items, \d+\.\d items/s, \d+\.\d s", progress[0]), progress
        assert re.fullmatch(r"progress: 30 of 30 items, \d+\.\d items/s, \d+\.\d s", progress[-1]), progress
    assert meta["gpus"] == [] and meta["num_steps"] == 2
    assert log.children_left == []


SEGMENTED = {
    "source": {"synthetic": True},
    "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
         "num_shared_tensors": 4, "num_segments": 2, "clips": 4, "frames": 2, "height": 8, "width": 8},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [0, 0], "in_queue": 0, "out_queues": [1]}],
         "num_shared_tensors": 4, "clips": 2, "record_pid": True},
        {"model": "models.toy.SegmentMerger", "queue_groups": [{"gpus": [-1], "in_queue": 1}]},
    ],
}


@pytest.mark.slow
def test_gpu_config_without_gpu_exits_2_and_cpu_flag_runs_replicas_and_merges_segments(tmp_path, capsys, run):
    config = write_config(tmp_path, SEGMENTED)
    assert cli.main(["-c", config, "-v", "24", "-mi", "0", "--log-dir", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pipeline[1].queue_groups[0].gpus" in err and "--cpu" in err
    assert not (tmp_path / "refused").exists()

    # Enough items that a replica the loaded machine starts late still gets some of them.
    code, log = run(tmp_path / "logs", "-c", config, "-v", "120", "-mi", "0", "--cpu", "--warmup", "0")
    meta, rows = log.meta, log.rows
    assert code == 0 and meta["termination_reason"] == "target reached"
    assert [row["item_id"] for row in rows] == list(range(120))
    replicas = {p["pid"] for p in meta["processes"] if p["step"] == 1}
    seen = {int(pid) for row in rows for pid in row["convnet_pid"].split("+")}
    assert seen == replicas and len(replicas) == 2
    for row in rows:
        assert row["device1"] == "cpu" and row["frames_decoded"] == 8  # counted once, not once per segment
        # The item follows its first segment to reach step 2, then waits there for the other one.
        chain = ["enqueue", *(c.format(k=k) for k in range(2) for c in SEGMENT_CHAIN), "runner2_start",
                 "siblings2_arrived", "inference2_start", "inference2_finish", "runner2_finish"]
        assert [row[name] for name in chain] == sorted(row[name] for name in chain)
        arrivals = [row[f"seg{i}_runner2_start"] for i in range(2)]
        assert (row["runner2_start"], row["siblings2_arrived"]) == (min(arrivals), max(arrivals))
        first = arrivals.index(min(arrivals))
        for i in range(2):
            own = [f"seg{i}_{c.format(k=k)}" for k, c in [(0, c) for c in SEGMENT_CHAIN[3:]] + [(1, c) for c in SEGMENT_CHAIN]]
            own += [f"seg{i}_runner2_start", f"seg{i}_inference2_start"]
            assert [row[name] for name in own] == sorted(row[name] for name in own)
            assert (row[f"seg{i}_out_queue0"], row[f"seg{i}_group1"], row[f"seg{i}_out_queue1"]) == (0, 0, 1)
        assert row["instance1"] == row[f"seg{first}_instance1"] and row["runner1_start"] == row[f"seg{first}_runner1_start"]
        parts = {key: float(value[0]) for key, value in part_latencies(pa.Table.from_pylist([row]), 3).items()}
        e2e = parts.pop("e2e")
        assert min(parts.values()) >= 0 and sum(parts.values()) == pytest.approx(e2e, abs=1e-9)
        assert parts["siblingwait2"] == row["siblings2_arrived"] - row["runner2_start"] > 0
        assert parts["siblingwait0"] == parts["siblingwait1"] == 0
    assert {row[f"seg{i}_instance1"] for row in rows for i in range(2)} == {0, 1}
    assert log.children_left == []


ROUTED = {
    "source": {"synthetic": True},
    "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0, 1]}],
         "num_shared_tensors": 4},
        {"model": "models.batcher.Batcher", "num_shared_tensors": 4, "batch": 2, "timeout_ms": 60000,
         "num_clips": 2, "clip_length": 4, "size": 16,
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}, {"gpus": [-1], "in_queue": 1, "out_queues": [0]}]},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}], "clips": 4},
    ],
}


@pytest.mark.slow
def test_every_item_logs_the_replica_output_queue_and_batch_of_each_step(tmp_path, run):
    code, log = run(tmp_path / "logs", "-c", write_config(tmp_path, ROUTED), "-v", "8", "-mi", "0")
    rows = log.rows
    assert code == 0 and [row["item_id"] for row in rows] == list(range(8))
    route = ["group{k}", "instance{k}", "batch{k}", "batch_size{k}", "out_queue{k}"]
    for row in rows:
        i = row["item_id"]
        # Round robin over queues 0 and 1; each queue feeds its own batcher group, which batches pairs in order.
        assert [row[c.format(k=0)] for c in route] == [0, 0, i, 1, i % 2]
        assert [row[c.format(k=1)] for c in route] == [i % 2, 0, i // 4, 2, 0]
        assert [row[c.format(k=2)] for c in route[:4]] == [0, 0, row["batch2"], 2] and "out_queue2" not in row
    batches = {}
    for row in rows:
        batches.setdefault((row["group1"], row["batch1"]), set()).add(row["batch2"])
    assert sorted(batches) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # analyze.py's table names the config and the batches the steps ran with (the Batcher's 2), not -b's 1.
    job = load_jobs(tmp_path / "logs").jobs.to_pylist()[0]
    assert (job["config"], job["batch_sizes"], job["batch_size"]) == ("config", "1/2/2", 1)
    header = format_summary(load_jobs(tmp_path / "logs").jobs).splitlines()[0].split()
    assert header[:5] == ["job", "config", "batch", "load", "reason"]
    assert all(len(seen) == 1 for seen in batches.values())  # a batch stays one batch at the next step
    assert sorted(seen.pop() for seen in batches.values()) == [0, 1, 2, 3]
    assert log.children_left == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_bulk_client_done_before_step_0_has_read_its_requests_still_delivers_every_one(tmp_path, run):
    # 1,500 requests are more than the request pipe holds; step 0, 2 ms per item, reads them over seconds,
    # long after the client has queued the last one and exited.
    slow = write_config(tmp_path, {"source": {"synthetic": True}, "pipeline": [
        {"model": "bench.harness_bench.Idle", "queue_groups": [{"gpus": [-1], "out_queues": [0]}], "sleep_ms": 2.0},
        {"model": "bench.harness_bench.Idle", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]})
    code, log = run(tmp_path / "logs", "-c", slow, "-mi", "0", "-v", "1500")
    assert code == 0 and log.meta["termination_reason"] == "target reached"
    assert [row["item_id"] for row in log.rows] == list(range(1500))
    client = next(p for p in log.meta["processes"] if p["name"] == "client")
    assert (client["status"], client["exitcode"]) == ("ok", 0)
