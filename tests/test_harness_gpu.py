"""The CUDA paths: shared CUDA slots, per-runner streams, device columns and peak device memory.

Skipped without CUDA (tests/conftest.py); they run where a GPU is present.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rnb import cli
from rnb.core.messages import Signal
from rnb.core.timecard import TimeCard
from rnb.engines.local.driver import allocate_slots
from rnb.engines.local.plumbing import Plumbing, SharedSlot
from rnb.engines.local.transport import LocalTransport, LocalWiring
from rnb.pipeline.config import parse_config
from rnb.pipeline.gpus import Nvml
from rnb.pipeline.plan import plan_runners


@pytest.mark.gpu
def test_cuda_slot_round_trip_on_a_side_stream():
    device = torch.device("cuda:0")
    slot = SharedSlot.allocate(mp.get_context("spawn"), ((8, 4),), device)
    assert slot.tensors[0].device == device and slot.sizes[:] == [0]
    stream = torch.cuda.Stream(device)
    data = torch.arange(12, dtype=torch.float32, device=device).reshape(3, 4)
    with torch.cuda.stream(stream):
        slot.write((data,), "gpu test")
        (on_gpu,) = slot.read(device)
        stream.synchronize()
    (on_cpu,) = slot.read(torch.device("cpu"))
    assert torch.equal(on_gpu, data) and torch.equal(on_cpu, data.cpu())


@pytest.mark.gpu
def test_toy_pipeline_on_gpu_0_uses_cuda_slots_and_reports_device_memory(tmp_path, job_log):
    document = json.loads(Path("config/toy.json").read_text())
    for step in document["pipeline"]:
        step["queue_groups"][0]["gpus"] = [0]
    config = tmp_path / "gpu.json"
    config.write_text(json.dumps(document))
    assert cli.main(["-c", str(config), "-v", "40", "-mi", "0", "--log-dir", str(tmp_path / "logs")]) == 0
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert meta["termination_reason"] == "target reached" and len(rows) == 40
    assert {(row["device0"], row["device1"]) for row in rows} == {("cuda:0", "cuda:0")}
    assert [gpu["logical_index"] for gpu in meta["gpus"]] == [0]
    runners = [p for p in meta["processes"] if p["role"] == "runner"]
    assert all(p["device"] == "cuda:0" and p["peak_device_bytes"] > 0 for p in runners)
    client = next(p for p in meta["processes"] if p["role"] == "client")
    assert (client["device_process_bytes"], client["device_outside_allocator_bytes"]) == (None, None)
    with Nvml() as nvml:  # this process holds the job's CUDA slots: NVML lists it unless it sees other pids
        if os.getpid() not in nvml.process_memory(str(torch.cuda.get_device_properties(0).uuid)):
            pytest.skip("NVML reports the pids of another pid namespace")
    # each runner's own CUDA context and library handles, apart from torch's allocator; the main process's too
    assert all(p["device_process_bytes"] >= p["device_outside_allocator_bytes"] > 2**20 for p in runners)
    main = meta["gpus"][0]["main_process"]
    assert main["device_process_bytes"] >= main["device_outside_allocator_bytes"] > 2**20


@pytest.mark.gpu
def test_split_loader_bytes_reach_a_gpu_decoder_in_host_memory():
    """Fetcher and decoder on GPU 0: the mini-MP4 bytes go from a host slot to a host buffer, never to the GPU."""
    document = {"source": {}, "pipeline": [
        {"model": "models.episode.EpisodeFetcher", "queue_groups": [{"gpus": [0], "out_queues": [0]}], "max_bytes": 64},
        {"model": "models.episode.EpisodeDecoder", "queue_groups": [{"gpus": [0], "in_queue": 0, "out_queues": [0]}]},
        {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [0], "in_queue": 0}]}]}
    fetch, decode, _ = plan_runners(parse_config(document, "split.json"), 1)
    ctx = mp.get_context("spawn")
    slots = allocate_slots(ctx, fetch)
    plumbing = Plumbing.build(ctx, [{0}, {0}], 10, None)
    transport = LocalTransport(decode, 1, LocalWiring((), {(0, 0): slots}), plumbing)
    data = torch.arange(40, dtype=torch.uint8)
    slots[0].free.clear()
    slots[0].write((data,), "fetcher")
    plumbing.step_queues[0][0].put(Signal(0, 0, 0, 0, {}, TimeCard(0, "0")))
    (received,) = transport.receive(timeout=10).tensors
    assert slots[0].tensors[0].device.type == received.device.type == "cpu"
    assert torch.equal(received, data) and slots[0].free.is_set()
