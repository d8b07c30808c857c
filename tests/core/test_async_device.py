"""Work that runs asynchronously on a device is timed where it completes (rnb.core.device), on the CPU stand-in."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from models.toy import AsyncSleep, SleepingDevice, SyntheticFrames
from rnb import cli
from rnb.core.stages import END_TO_END, part_latencies
from rnb.core.timecard import TimeCard

SLEEP_MS = 20.0


def _chain(final: dict) -> dict:
    return {"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
         "num_shared_tensors": 4},
        {"model": "models.toy.AsyncSleep", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}],
         "num_shared_tensors": 4, "ms": SLEEP_MS},
        {**final, "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}


def test_a_sleeping_device_applies_work_in_order_and_only_when_done():
    device = SleepingDevice()
    written: list[int] = []
    before = device.mark()
    device.submit(0.03, lambda: written.append(1))
    device.submit(0.0, lambda: written.append(2))
    assert written == []  # submitting returns before the work is done
    after = device.mark()
    after.wait()
    before.wait()
    assert written == [1, 2]
    assert 30.0 <= after.ms_since(before) < 1000.0


def test_async_sleep_returns_at_once_and_its_output_holds_values_only_once_done():
    model = AsyncSleep(torch.device("cpu"), ms=50.0, ms_per_item=25.0)
    cards = (TimeCard(3), TimeCard(4))
    began = model.device_queue.mark()
    returned = time.monotonic()
    frames = SyntheticFrames.frames_for(3, (2, 3, 4, 16, 16))
    (output,), _, passed = model((frames,), {"x": 1}, cards)
    returned = time.monotonic() - returned
    assert passed is cards and returned < 0.05
    assert not torch.equal(output, frames)  # not written yet: the "device" is still at work
    done = model.device_queue.mark()
    done.wait()
    assert torch.equal(output, frames)
    assert done.ms_since(began) >= 50.0 + 2 * 25.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["-mi", "0"], ["-mi", "5"]], ids=["bulk", "poisson"])
def test_every_step_of_asynchronous_work_is_timed_where_the_work_completed(tmp_path: Path, job_log, mode: list[str]):
    config = tmp_path / "async.json"
    config.write_text(json.dumps(_chain({"model": "models.toy.AsyncSleep", "ms": SLEEP_MS})))
    code = cli.main(["-c", str(config), "-v", "40", "--warmup", "0", "--log-dir", str(tmp_path / "logs"), *mode])
    log = job_log(tmp_path / "logs")
    assert code == 0 and len(log.rows) == 40
    for row in log.rows:
        for k in (1, 2):
            inside_ms = (row[f"inference{k}_finish"] - row[f"inference{k}_start"]) * 1000
            assert inside_ms >= SLEEP_MS, (row["item_id"], k, inside_ms)
            assert SLEEP_MS <= row[f"device_ms{k}"] <= inside_ms + 1.0
        assert "device_ms0" not in row  # a step whose work is synchronous has no device time
    table = pq.read_table(log.dir / "timings.parquet")
    parts = part_latencies(table, 3)
    total = sum(values for key, values in parts.items() if key != END_TO_END.key)
    assert list(total) == pytest.approx(list(parts[END_TO_END.key]), abs=1e-9)


@pytest.mark.slow
def test_the_next_step_reads_the_finished_output_not_the_unfinished_one(tmp_path: Path, job_log):
    config = tmp_path / "digest.json"
    config.write_text(json.dumps(_chain({"model": "tests.support.fixture_models.Digest"})))
    code = cli.main(["-c", str(config), "-mi", "0", "-v", "12", "--warmup", "0", "--log-dir", str(tmp_path / "logs")])
    log = job_log(tmp_path / "logs")
    assert code == 0
    for row in log.rows:
        frames = SyntheticFrames.frames_for(row["item_id"], (2, 3, 4, 16, 16))
        assert row["digest"] == hashlib.sha256(frames.numpy().tobytes()).hexdigest()[:16]
