"""Harness policies decided in the main process: thread shares, selector keywords, reused input buffers, set-up failure."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from models.aggregator import Aggregator
from models.batcher import Batcher
from rnb import cli
from rnb.core.timecard import TimeCard
from rnb.engines.buffers import LocalBuffers
from rnb.engines.local import driver
from rnb.engines.local.lifeline import children_context
from rnb.engines.local.plumbing import SharedSlot
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.plan import plan_runners

CTX = children_context()


def _pipeline(first_group: dict, last_step: dict | None = None) -> dict:
    return {"pipeline": [
        {"model": "tests.support.fixture_models.Frames", "queue_groups": [{"out_queues": [0], **first_group}]},
        {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1], "in_queue": 0}], **(last_step or {})},
    ]}


def test_cpu_runners_share_the_cores_and_a_threads_keyword_is_consumed(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    config = parse_config(_pipeline({"gpus": [-1, -1]}, {"threads": 5}), "c.json")
    placements = plan_runners(config, 1)
    assert [(p.name, p.threads) for p in placements] == [("step0-g0-r0", 2), ("step0-g0-r1", 2), ("step1-g0-r0", 5)]
    assert all("threads" not in p.model_kwargs for p in placements)


def test_every_cpu_runner_gets_at_least_one_thread_and_cuda_runners_keep_the_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    placements = plan_runners(parse_config(_pipeline({"gpus": [-1, -1, 0]}), "c.json"), 1)
    assert [p.threads for p in placements] == [1, 1, None, 1]


def test_queue_selector_kwargs_reach_the_selector_and_bad_ones_are_config_errors():
    group = {"gpus": [-1], "out_queues": [0, 1], "queue_selector": "selector.LargeSmallSelector"}
    document = {"pipeline": [
        {"model": "tests.support.fixture_models.Frames", "queue_groups": [{**group, "queue_selector_kwargs": {"threshold": 6}}]},
        {"model": "tests.support.fixture_models.Head",
         "queue_groups": [{"gpus": [-1], "in_queue": 0}, {"gpus": [-1], "in_queue": 1}]},
    ]}
    (first, *_) = plan_runners(parse_config(document, "c.json"), 1)
    assert first.selector_kwargs == {"threshold": 6}

    document["pipeline"][0]["queue_groups"][0]["queue_selector_kwargs"] = {"treshold": 6}
    with pytest.raises(ConfigError) as error:
        plan_runners(parse_config(document, "c.json"), 1)
    assert str(error.value) == (
        "c.json: pipeline[0].queue_groups[0].queue_selector_kwargs: expected keywords that selector.LargeSmallSelector "
        "accepts, found TypeError: LargeSmallSelector.__init__() got an unexpected keyword argument 'treshold'")

    document["pipeline"][0]["queue_groups"][0]["queue_selector_kwargs"] = {"threshold": -1}
    with pytest.raises(ConfigError,
                       match=r"found ValueError: LargeSmallSelector's threshold must be an int >= 0 \(clips\), got -1"):
        plan_runners(parse_config(document, "c.json"), 1)


def test_reads_into_local_buffers_reuse_one_buffer_per_shape_and_copy_only_valid_rows():
    slots = [SharedSlot.allocate(CTX, ((4, 3), (2,)), torch.device("cpu")) for _ in range(2)]
    buffers = LocalBuffers(torch.device("cpu"))
    slots[0].write((torch.full((3, 3), 1.0), torch.tensor([5.0, 6.0])), "here")
    first, small = slots[0].read(torch.device("cpu"), buffers)
    assert torch.equal(first, torch.full((3, 3), 1.0)) and torch.equal(small, torch.tensor([5.0, 6.0]))
    slots[1].write((torch.full((2, 3), 2.0), torch.tensor([7.0])), "here")
    second, _ = slots[1].read(torch.device("cpu"), buffers)
    assert torch.equal(second, torch.full((2, 3), 2.0))
    assert second.data_ptr() == first.data_ptr() != slots[1].tensors[0].data_ptr()
    assert small.data_ptr() != first.data_ptr()  # same dtype, other position: its own buffer
    assert torch.equal(first, torch.tensor([[2.0] * 3, [2.0] * 3, [1.0] * 3]))  # the earlier view saw the overwrite


def test_batcher_and_aggregator_keep_copies_not_the_reused_inputs():
    batcher = Batcher(torch.device("cpu"), batch=2, num_clips=1, clip_length=1, size=1)
    reused = torch.full((1, 3, 1, 1, 1), 1.0)
    assert batcher((reused,), {"num_clips": 1}, TimeCard(0))[2] is None
    reused.fill_(2.0)
    (batch,), _, cards = batcher((reused,), {"num_clips": 1}, TimeCard(1))
    assert [float(row.sum()) for row in batch] == [3.0, 6.0] and [c.item_id for c in cards] == [0, 1]

    aggregator = Aggregator(torch.device("cpu"), num_classes=2)
    first, second = TimeCard(4).fork(2)
    logits = torch.tensor([[1.0, 0.0]])
    assert aggregator((logits,), {}, first)[2] is None
    logits.copy_(torch.tensor([[0.0, 3.0]]))
    (sums,), _, card = aggregator((logits,), {}, second)
    assert torch.equal(sums, torch.tensor([[1.0, 3.0]])) and card.fields["prediction"] == 1


def _toy_config(tmp_path: Path) -> str:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(_pipeline({"gpus": [-1]})))
    return str(path)


@pytest.mark.parametrize("failure, reported", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail"),
     "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"),
    (TypeError("zeros(): argument 'size' failed to unpack the object at pos 3"),
     "TypeError: zeros(): argument 'size' failed to unpack the object at pos 3"),
], ids=["out_of_memory", "size_torch_refuses"])
def test_a_setup_failure_writes_meta_and_exits_1_with_one_sentence(tmp_path, monkeypatch, capsys, job_log, failure,
                                                                   reported):
    def refuse(ctx, placement):
        raise failure
    monkeypatch.setattr(driver, "allocate_slots", refuse)
    code = cli.main(["-c", _toy_config(tmp_path), "-v", "3", "--log-dir", str(tmp_path / "logs")])
    assert code == 1
    meta = job_log(tmp_path / "logs").meta
    expected = f"could not set up the queues and shared tensors ({reported}); lower num_shared_tensors, the output shapes or -qs"
    assert (meta["termination_reason"], meta["error"], meta["finished_items"], meta["processes"]) == (
        "setup failed", expected, 0, [])
    assert capsys.readouterr().err == f"benchmark.py: {expected}\n"


@pytest.mark.parametrize("preset", [None, "FASTEST_FIRST"])
def test_cuda_device_order_is_pci_bus_id_unless_the_user_chose(tmp_path, monkeypatch, preset):
    if preset is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", preset)
    assert cli.main(["-c", _toy_config(tmp_path), "--check"]) == 0
    assert os.environ["CUDA_DEVICE_ORDER"] == (preset or "PCI_BUS_ID")


def test_command_line_values_are_checked_against_the_config_table(tmp_path, capsys):
    assert cli.main(["-c", _toy_config(tmp_path), "-qs", str(2**31), "--check"]) == 2
    assert capsys.readouterr().err == (
        f"command line: -qs/--queue_size: expected an integer from 1 to {2**31 - 1}, found {2**31}\n")
