"""The Chrome trace export: a hand-made job checked slice by slice, and a real toy job checked item by item."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rnb.analysis.job_dirs import read_job
from rnb.analysis.routing import replicas
from tests.support.handmade_job import ORIGIN, process, run_analyze, step_times, write_job
from tests.support.shared_jobs import BULK_TOY_VIDEOS, bulk_toy_job

REPO = Path(__file__).resolve().parents[2]


def check_nesting(events: list[dict[str, Any]]) -> None:
    """Perfetto's rule for a thread track: every two complete slices are disjoint or one holds the other."""
    by_track = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            by_track[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    for track, spans in by_track.items():
        stack: list[tuple[int, int]] = []
        for start, end in sorted(spans, key=lambda span: (span[0], -span[1])):
            while stack and stack[-1][1] <= start and not (stack[-1][0] == start == stack[-1][1] == end):
                stack.pop()
            assert not stack or end <= stack[-1][1], f"track {track}: {(start, end)} crosses {stack[-1]}"
            stack.append((start, end))


def names(trace: dict[str, Any]) -> tuple[dict[tuple[int, int], str], dict[int, str]]:
    threads, processes = {}, {}
    for event in trace["traceEvents"]:
        if event["ph"] == "M" and event["name"] == "thread_name":
            threads[(event["pid"], event["tid"])] = event["args"]["name"]
        if event["ph"] == "M" and event["name"] == "process_name":
            processes[event["pid"]] = event["args"]["name"]
    return threads, processes


def item_slices(trace: dict[str, Any]) -> dict[int, list[tuple[str, str, int, int]]]:
    """Per item: (thread, slice, ts, dur) of its complete slices, in trace order."""
    threads, _ = names(trace)
    found = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            found[event["args"]["item"]].append(
                (threads[(event["pid"], event["tid"])], event["name"], event["ts"], event["dur"]))
    return found


def queue_waits(trace: dict[str, Any]) -> dict[int, list[tuple[str, int, int]]]:
    """Per item: (queue, begin, end) of each async queue slice."""
    _, processes = names(trace)
    begins, found = {}, defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "b":
            begins[event["id"]] = event
        elif event["ph"] == "e":
            begin = begins.pop(event["id"])
            assert (begin["pid"], begin["name"], begin["cat"]) == (event["pid"], event["name"], event["cat"])
            found[begin["args"]["item"]].append((processes[event["pid"]], begin["ts"], event["ts"]))
    assert not begins
    return found


def flows(trace: dict[str, Any]) -> dict[int, list[tuple[str, str]]]:
    """Per bind_id: (slice name, direction) of the slices it joins, in trace order."""
    found = defaultdict(list)
    for event in trace["traceEvents"]:
        if "bind_id" in event:
            direction = {(False, True): "out", (True, True): "through", (True, False): "in"}[
                (event.get("flow_in", False), event.get("flow_out", False))]
            found[event["bind_id"]].append((event["name"], direction))
    return found


def counters(trace: dict[str, Any], name: str) -> dict[str, list[tuple[int, int]]]:
    _, processes = names(trace)
    found = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "C" and event["name"] == name:
            found[processes[event["pid"]]].append((event["ts"], event["args"]["items"]))
    return found


def test_every_slice_of_a_handmade_job_in_place_and_order(handmade: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = run_analyze(str(handmade), "--trace", str(out))
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    threads, processes = names(trace)
    assert sorted(threads.values()) == ["client", "step0-g0-r0", "step1-g0-r0", "step1-g0-r0 (held items, lane 1)",
                                        "step1-g0-r1"]
    assert sorted(processes.values()) == ["node testhost", "queue: requests → step 0", "queue: step 0 → step 1 (queue 0)"]
    loader, cpu, lane1, gpu = "step0-g0-r0", "step1-g0-r0", "step1-g0-r0 (held items, lane 1)", "step1-g0-r1"
    assert item_slices(trace) == {
        0: [("client", "enqueue", 1000, 0), (loader, "copy", 2000, 1000), (loader, "inside", 3000, 3000),
            (loader, "fetch", 3500, 500), (loader, "decode", 4000, 1000), (loader, "slot wait", 6000, 1000),
            (loader, "copy", 7000, 1000), (cpu, "copy", 10000, 1000), (cpu, "inside", 11000, 9000),
            (cpu, "copy", 20000, 1000)],
        1: [("client", "enqueue", 1000, 0), (loader, "copy", 8000, 1000), (loader, "inside", 9000, 3000),
            (loader, "fetch", 9000, 1000), (loader, "decode", 10000, 1500), (loader, "copy", 12000, 1000),
            (loader, "slot wait", 12000, 0), (gpu, "copy", 14000, 1000), (gpu, "inside", 15000, 3400),
            (gpu, "copy", 18400, 600)],
        2: [("client", "enqueue", 2000, 0), (loader, "copy", 13000, 1000), (loader, "inside", 14000, 2000),
            (loader, "fetch", 14000, 1000), (loader, "decode", 15000, 1000), (loader, "slot wait", 16000, 1000),
            (loader, "copy", 17000, 1000), (lane1, "copy", 18500, 1000), (lane1, "inside", 19500, 4500),
            (lane1, "copy", 24000, 1000)],
    }
    requests, step1 = "queue: requests → step 0", "queue: step 0 → step 1 (queue 0)"
    assert queue_waits(trace) == {0: [(requests, 1000, 2000), (step1, 8000, 10000)],
                                  1: [(requests, 1000, 8000), (step1, 13000, 14000)],
                                  2: [(requests, 2000, 13000), (step1, 18000, 18500)]}
    hop = [("enqueue", "out"), ("queue", "through"), ("copy", "in")]
    later = [("copy", "out"), ("queue", "through"), ("copy", "in")]
    assert flows(trace) == {item * 2 + k: hop if k == 0 else later for item in range(3) for k in range(2)}
    assert counters(trace, "in flight") == {"node testhost": [(1000, 2), (2000, 3), (19000, 2), (21000, 1), (25000, 0)]}
    assert counters(trace, "depth") == {
        requests: [(1000, 2), (2000, 2), (8000, 1), (13000, 0)],
        step1: [(8000, 1), (10000, 0), (13000, 1), (14000, 0), (18000, 1), (18500, 0)]}
    check_nesting(trace["traceEvents"])
    assert trace["otherData"] == {"job_id": "handmade", "origin_epoch_s": ORIGIN}


def test_replicas_on_one_device_are_told_apart_by_the_logged_route(tmp_path: Path) -> None:
    config = {"pipeline": [
        {"model": "m.Loader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "m.Net", "queue_groups": [{"gpus": [-1, -1], "in_queue": 0}]}]}
    processes = [process("client", "client", None, None, None, None),
                 process("step0-g0-r0", "runner", 0, 0, 0, "cpu"),
                 process("step1-g0-r0", "runner", 1, 0, 0, "cpu"),
                 process("step1-g0-r1", "runner", 1, 0, 1, "cpu")]
    rows = [{"item_id": item, "enqueue": 1.0, **step_times(0, 2.0, 3.0, 4.0, 5.0), **step_times(1, 6.0, 7.0, 8.0, 9.0),
             "device0": "cpu", "device1": "cpu"} for item in range(3)]
    unrouted = read_job(write_job(tmp_path / "old", rows, processes, config, num_steps=2))
    assert replicas(unrouted, 0) == ["step0-g0-r0"] * 3
    assert replicas(unrouted, 1) == ["step 1: replica not logged"] * 3
    for row, instance in zip(rows, [1, 0, 1]):
        row.update(group1=0, instance1=instance)
    routed = read_job(write_job(tmp_path / "new", rows, processes, config, num_steps=2))
    assert replicas(routed, 1) == ["step1-g0-r1", "step1-g0-r0", "step1-g0-r1"]


def test_a_merging_step_shows_the_wait_for_sibling_segments_before_its_copy(tmp_path: Path) -> None:
    config = {"pipeline": [
        {"model": "m.Splitter", "num_segments": 2, "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "m.Merger", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
    processes = [process("client", "client", None, None, None, None),
                 process("step0-g0-r0", "runner", 0, 0, 0, "cpu"), process("step1-g0-r0", "runner", 1, 0, 0, "cpu")]
    rows = [{"item_id": 0, "enqueue": 1.0, **step_times(0, 2.0, 3.0, 4.0, 6.0, acquired=5.0),
             **step_times(1, 7.0, 10.0, 11.0, 12.0), "siblings1_arrived": 9.0, "device0": "cpu", "device1": "cpu"}]
    out = tmp_path / "trace.json"
    done = run_analyze(str(write_job(tmp_path / "logs" / "merged", rows, processes, config, num_steps=2)),
                       "--trace", str(out))
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    merger = "step1-g0-r0"
    assert item_slices(trace)[0][-4:] == [(merger, "sibling wait", 7000, 2000), (merger, "copy", 9000, 1000),
                                         (merger, "inside", 10000, 1000), (merger, "copy", 11000, 1000)]
    assert flows(trace)[1] == [("copy", "out"), ("queue", "through"), ("sibling wait", "in")]
    check_nesting(trace["traceEvents"])


def test_trace_needs_exactly_one_job(handmade: Path, tmp_path: Path) -> None:
    other = tmp_path / "logs" / "second"
    other.mkdir()
    for name in ("meta.json", "config.json", "timings.parquet"):
        (other / name).write_bytes((handmade / name).read_bytes())
    done = run_analyze(str(tmp_path / "logs"), "--trace", str(tmp_path / "t.json"))
    assert (done.returncode, done.stderr) == (2, f"analyze: --trace writes one job's timeline; "
                                                 f"{tmp_path / 'logs'} holds 2 jobs; name one job's directory, such "
                                                 f"as {other}.\n")
    assert not (tmp_path / "t.json").exists()


@pytest.fixture(scope="module")
def toy_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy config's bulk job that other modules read too (tests/support/shared_jobs.py)."""
    shared = bulk_toy_job(tmp_path_factory.getbasetemp())
    assert shared.done.returncode == 0, shared.done.stderr
    (job,) = shared.log_dir.iterdir()
    return job


def test_a_real_job_traces_every_item_exactly_as_logged(toy_job: Path, tmp_path: Path, job_log) -> None:
    out = tmp_path / "trace.json"
    assert run_analyze(str(toy_job), "--trace", str(out)).returncode == 0
    trace = json.loads(out.read_text())
    log = job_log(toy_job)
    timings = log.rows
    origin = trace["otherData"]["origin_epoch_s"]
    assert origin == min(log.meta["start_time"], min(r["enqueue"] for r in timings))

    def us(seconds: float) -> int:
        return int(np.round((seconds - origin) * 1e6))

    slices, waits = item_slices(trace), queue_waits(trace)
    assert sorted(slices) == sorted(waits) == list(range(BULK_TOY_VIDEOS))
    for row in timings:
        parts = [("enqueue", row["enqueue"], row["enqueue"])]
        parts += [("copy", row["runner0_start"], row["inference0_start"]),
                  ("inside", row["inference0_start"], row["inference0_finish"]),
                  ("slot wait", row["inference0_finish"], row["slot0_acquired"]),
                  ("copy", row["slot0_acquired"], row["runner0_finish"]),
                  ("copy", row["runner1_start"], row["inference1_start"]),
                  ("inside", row["inference1_start"], row["inference1_finish"]),
                  ("copy", row["inference1_finish"], row["runner1_finish"])]
        threads = ["client"] + ["step0-g0-r0"] * 4 + ["step1-g0-r0"] * 3
        expected = [(thread, n, us(a), us(b) - us(a)) for thread, (n, a, b) in zip(threads, parts)]
        # Trace order: by time, and at one instant the longer (enclosing) slice first.
        assert slices[row["item_id"]] == sorted(expected, key=lambda part: (part[2], -part[3]))
        assert [(begin, end) for _, begin, end in waits[row["item_id"]]] == [
            (us(row["enqueue"]), us(row["runner0_start"])), (us(row["runner0_finish"]), us(row["runner1_start"]))]
    assert all(len(joined) == 3 for joined in flows(trace).values()) and len(flows(trace)) == 2 * BULK_TOY_VIDEOS
    check_nesting(trace["traceEvents"])
