"""bench/run.py end to end on its cheapest figures (P5, P1h), its argument errors, and the helpers of harness rows."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bench import scaling_bench
from bench.common import Effort, Goal, Row, table_text
from bench.harness_bench import Idle, chain_pipeline, hop_costs, per_hop_us, window_rates
from bench.run import BENCHMARKS, run_benchmarks
from bench.scaling_bench import loader_windows
from rnb import cli

ENTRY_KEYS = {"id", "what", "ratio", "goal", "met", "min", "max", "reps", "a", "b", "note"}


class QuickRun(NamedTuple):
    """What one `bench/run.py --quick --only P5,P1h` run printed and wrote."""

    done: subprocess.CompletedProcess[str]
    document: dict[str, Any]

    def entries(self, *ids: str) -> list[dict[str, Any]]:
        return [entry for entry in self.document["entries"] if entry["id"] in ids]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    """Both cheap figures from one process: each test reads its own rows (a second start would cost a torch import
    and a job's start-up again)."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    done = subprocess.run([sys.executable, "bench/run.py", "--quick", "--only", "P5,P1h", "--json", str(path)],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    return QuickRun(done, json.loads(path.read_text()))


@pytest.mark.slow
def test_quick_p5_writes_both_rows_with_every_key(quick_run: QuickRun) -> None:
    assert quick_run.document["quick"] is True
    assert [entry["id"] for entry in quick_run.document["entries"]] == ["P5", "P5t", "P1h", "P1hc"]
    entries = quick_run.entries("P5", "P5t")
    for entry in entries:
        assert set(entry) == ENTRY_KEYS
        assert entry["reps"] == 5 and len(entry["a"]["values"]) == 5 and len(entry["b"]["values"]) == 5
        assert entry["min"] <= entry["ratio"] <= entry["max"]
        assert entry["met"] == (entry["ratio"] >= float(entry["goal"].split()[1]))
        assert entry["a"]["unit"] == entry["b"]["unit"] == "items/s"
    assert [entry["goal"] for entry in entries] == [">= 5", ">= 1"]
    table = quick_run.done.stdout.splitlines()
    assert table[0].split()[:3] == ["id", "what", "A"]
    assert [line.split()[0] for line in table[2:6]] == ["P5", "P5t", "P1h", "P1hc"]


def test_an_unknown_benchmark_name_is_exit_2_with_one_sentence() -> None:
    done = subprocess.run([sys.executable, "bench/run.py", "--only", "P1h,P99"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("bench/run.py: --only: unknown benchmark 'P99'; "
                           f"expected names among {', '.join(BENCHMARKS)}\n")
    assert {"P1h", "P2", "P2r", "P3n", "P3r", "P10", "P11"} <= set(BENCHMARKS)
    assert done.stdout == ""


def test_window_rates_split_finishes_into_equal_groups() -> None:
    # 6 items after a start at 10.0: groups (11, 12), (12.5, 14), (14, 15) -> 2/2, 2/2, 2/1 items/s.
    assert window_rates(10.0, [11.0, 12.0, 12.5, 14.0, 14.0, 15.0], 3) == [1.0, 1.0, 2.0]
    assert window_rates(0.0, [1.0, 2.0, 3.0, 4.0, 6.0], 2) == [2 / 2, 3 / 4]


def test_hop_costs_split_wall_and_sampled_cpu_time_per_item_per_hop(tmp_path) -> None:
    # Two windows of 2 items each: (10, 12] and (12, 14]; process a spends 1 CPU s per second throughout,
    # b spends 0.25 per second from 10 on, so each window holds 2.5 CPU s for 2 items through 4 hops.
    (tmp_path / "meta.json").write_text(json.dumps({"start_time": 10.0, "num_steps": 2}))
    pq.write_table(pa.table({"runner1_finish": [11.0, 12.0, 13.0, 14.0]}), tmp_path / "timings.parquet")
    pq.write_table(pa.table({"time": [9.0, 15.0, 10.0, 14.0, 10.0], "process": ["a", "a", "b", "b", None],
                             "cpu_s": [0.0, 6.0, 1.0, 2.0, None]}), tmp_path / "samples.parquet")
    assert hop_costs(tmp_path, 2, 4) == [(250_000.0, 312_500.0), (250_000.0, 312_500.0)]
    assert hop_costs(tmp_path, 1, 4) == [(250_000.0, 312_500.0)]


def test_loader_windows_give_items_per_second_and_the_cores_only_the_loaders_got(tmp_path) -> None:
    # Two windows of 2 items, (10, 12] and (12, 14]: loader-a runs on a full core, loader-b on half a core
    # from 12 on; main and the client spend CPU too, but they are not loaders.
    processes = [{"name": "client", "role": "client", "step": None}, {"name": "loader-a", "role": "runner", "step": 0},
                 {"name": "loader-b", "role": "runner", "step": 0}, {"name": "counter", "role": "runner", "step": 1}]
    (tmp_path / "meta.json").write_text(json.dumps({"start_time": 10.0, "num_steps": 2, "processes": processes}))
    pq.write_table(pa.table({"runner1_finish": [11.0, 12.0, 13.0, 14.0]}), tmp_path / "timings.parquet")
    pq.write_table(pa.table({"time": [10.0, 14.0, 10.0, 12.0, 14.0, 10.0, 14.0, 10.0, 14.0],
                             "process": ["loader-a", "loader-a", "loader-b", "loader-b", "loader-b", "main", "main",
                                         "client", "client"],
                             "cpu_s": [0.0, 4.0, 1.0, 1.0, 2.0, 0.0, 4.0, 0.0, 1.0]}), tmp_path / "samples.parquet")
    assert loader_windows(tmp_path, 2) == [(1.0, 1.0), (1.0, 1.5)]
    assert loader_windows(tmp_path, 1) == [(1.0, 1.25)]
    assert loader_windows(tmp_path, 1, skip=2) == [(1.0, 1.5)]   # timed from the second item's finish on


def test_p6_s_pipeline_is_valid_on_a_fresh_clone_whose_dataset_a_run_generates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A fresh clone has no data/synthetic until some job writes it: P6's jobs refused their config (exit 2) there.
    missing = tmp_path / "synthetic"
    monkeypatch.setattr(scaling_bench, "DATASET", missing)
    config = tmp_path / "p6.json"
    config.write_text(json.dumps(scaling_bench.scaling_pipeline(2)))
    assert cli.main(["-c", str(config), "--check"]) == 0
    assert f"dataset {missing} is missing: a run (without --check) generates it there" in capsys.readouterr().err
    assert not missing.exists()


def test_window_rates_refuses_more_windows_than_items() -> None:
    with pytest.raises(ValueError, match=r"^2 finished items cannot fill 5 windows$"):
        window_rates(0.0, [1.0, 2.0], 5)


@pytest.mark.slow
def test_quick_p1h_reports_the_hop_against_a_bare_queue_message_in_wall_and_cpu_time(quick_run: QuickRun) -> None:
    wall, cpu = quick_run.entries("P1h", "P1hc")
    for entry, goal, units in ((wall, ("<= 2.5", 2.5), ("us/item/hop", "us/message")),
                               (cpu, ("<= 3", 3.0), ("CPU us/item/hop", "CPU us/message"))):
        assert entry["goal"] == goal[0] and entry["reps"] == 5
        assert (entry["a"]["unit"], entry["b"]["unit"]) == units
        # Each repetition's harness figure over its own bare message's; the row is their median, min and max.
        ratios = sorted(a / b for a, b in zip(entry["a"]["values"], entry["b"]["values"]))
        assert (entry["ratio"], entry["min"], entry["max"]) == (ratios[2], ratios[0], ratios[-1])
        assert entry["met"] == (entry["ratio"] <= goal[1])
        assert all(value > 0 for value in entry["a"]["values"] + entry["b"]["values"])
    assert (wall["id"], cpu["id"]) == ("P1h", "P1hc")


def test_per_hop_us_divides_the_time_of_an_item_among_its_hops() -> None:
    assert per_hop_us(12_500.0, 4) == 20.0
    assert per_hop_us(250_000.0, 1) == 4.0


def test_idle_steps_hand_on_one_number_and_sleep_what_they_are_told() -> None:
    step = Idle(torch.device("cpu"), sleep_ms=20)
    started = time.perf_counter()
    tensors, non_tensors, card = step((), {"request": 3}, "card")
    assert time.perf_counter() - started >= 0.02
    assert [tuple(t.shape) for t in tensors] == [s for s in Idle.output_shape()] == [(1,)]
    assert (non_tensors, card) == ({"request": 3}, "card")


def test_chain_pipeline_gives_one_runner_per_step_linked_by_queue_0() -> None:
    config = chain_pipeline((("bench.harness_bench.Idle", {}),) * 3, -1)
    assert config == {"source": {"synthetic": True}, "pipeline": [
        {"model": "bench.harness_bench.Idle", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
         "num_shared_tensors": 4},
        {"model": "bench.harness_bench.Idle", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}],
         "num_shared_tensors": 4},
        {"model": "bench.harness_bench.Idle", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}


@pytest.mark.slow
def test_p12_times_children_started_both_ways_to_their_own_report():
    """Each side's figure is the mean start of children that really ran the report (queue.Empty if none did)."""
    import multiprocessing

    from bench.start_bench import start_seconds
    from rnb.engines.local.lifeline import children_context
    for context in (children_context(), multiprocessing.get_context("spawn")):
        began = time.monotonic()
        seconds = start_seconds(context, context.Queue())
        assert 0 < seconds <= time.monotonic() - began


@pytest.mark.slow
def test_p12j_times_a_whole_job_each_way_and_each_job_finishes_its_items(tmp_path: Path) -> None:
    from bench.start_bench import SERVER_AT_FIRST_CHILD, job_seconds
    for command in ([sys.executable, "benchmark.py"], [sys.executable, "-c", SERVER_AT_FIRST_CHILD]):
        began = time.monotonic()
        assert 0 < job_seconds(command, tmp_path / "logs", "toy.json") <= time.monotonic() - began
    jobs = sorted((tmp_path / "logs").iterdir())
    assert [pq.read_table(job / "timings.parquet").num_rows for job in jobs] == [10, 10]


def test_each_benchmark_s_rows_are_printed_and_kept_as_soon_as_it_is_done(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped during its third benchmark has the first two's rows, a failed one's included."""
    first = Row("X1", "first figure", Goal(">=", 1.0), ratio=1.5, low=1.4, high=1.6, reps=5)

    def fails(effort: Effort, space: object) -> list[Row]:
        raise RuntimeError("no data")

    def stopped(effort: Effort, space: object) -> list[Row]:
        raise KeyboardInterrupt

    monkeypatch.setitem(BENCHMARKS, "X1", lambda effort, space: [first])
    monkeypatch.setitem(BENCHMARKS, "X2", fails)
    monkeypatch.setitem(BENCHMARKS, "X3", stopped)
    kept: list[list[str]] = []
    with pytest.raises(KeyboardInterrupt):
        run_benchmarks(["X1", "X2", "X3"], Effort.of(True), lambda rows: kept.append([row.id for row in rows]))
    assert kept == [["X1"], ["X1", "X2"]]
    err = capsys.readouterr().err
    assert err.index(table_text([first])) < err.index("bench/run.py: X2 ...")
    assert "failed: RuntimeError: no data" in err
