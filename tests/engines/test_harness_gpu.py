"""The CUDA paths: shared CUDA slots, per-runner streams, device columns, device memory, IPC release, UUIDs.

Skipped without CUDA (tests/conftest.py); they run where a GPU is present.
Every job runs in a process of its own (the `benchmark_process` fixture), so that
none leaves a CUDA context or cached GPU memory in the test process.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rnb.core.messages import Signal
from rnb.core.timecard import TimeCard
from rnb.engines.local.driver import allocate_slots
from rnb.engines.local.plumbing import PinnedHostSlots, Plumbing, SharedSlot
from rnb.engines.local.shared_memory_transport import LocalTransport, LocalWiring
from rnb.pipeline.config import parse_config
from rnb.pipeline.gpus import GpuMismatchError, Nvml, check_device_uuid, child_environment, nvml_uuid
from rnb.pipeline.plan import plan_runners

REPO = Path(__file__).resolve().parents[2]


def _on_gpu(tmp_path: Path, gpus: list[list[int]]) -> str:
    """config/toy.json with step k's queue group on gpus[k]."""
    document = json.loads((REPO / "config/toy.json").read_text())
    for step, where in zip(document["pipeline"], gpus):
        step["queue_groups"][0]["gpus"] = where
    config = tmp_path / "gpu.json"
    config.write_text(json.dumps(document))
    return str(config)


@pytest.mark.gpu
def test_cuda_slot_round_trip_on_a_side_stream():
    device = torch.device("cuda:0")
    slot = SharedSlot.allocate(mp.get_context("spawn"), ((8, 4),), device)
    assert slot.tensors[0].device == device and slot.sizes[:] == [0]
    stream = torch.cuda.Stream(device)
    data = torch.arange(12, dtype=torch.float32, device=device).reshape(3, 4)  # queued on the default stream
    stream.wait_stream(torch.cuda.current_stream(device))  # the side stream must not copy before it is written
    with torch.cuda.stream(stream):
        slot.write((data,), "gpu test")
        (on_gpu,) = slot.read(device)
        stream.synchronize()
    (on_cpu,) = slot.read(torch.device("cpu"))
    assert torch.equal(on_gpu, data) and torch.equal(on_cpu, data.cpu())


@pytest.mark.gpu
def test_a_page_locked_host_slot_copies_to_and_from_the_gpu_asynchronously():
    slot = SharedSlot.allocate(mp.get_context("spawn"), ((1024, 1024),), torch.device("cpu"))
    pinned = PinnedHostSlots()
    assert not slot.tensors[0].is_pinned()
    assert pinned.pin([slot]) == 4 * 2**20 and slot.tensors[0].is_pinned()
    data = torch.rand((1024, 1024), device="cuda:0")
    slot.write((data,), "gpu test")  # non_blocking into page-locked memory
    torch.cuda.current_stream().synchronize()
    assert torch.equal(slot.tensors[0], data.cpu())
    pinned.unpin()
    assert not slot.tensors[0].is_pinned()


@pytest.mark.gpu
def test_toy_pipeline_on_gpu_0_uses_cuda_slots_and_reports_device_memory(tmp_path, job_log, benchmark_process):
    done = benchmark_process(["-c", _on_gpu(tmp_path, [[0], [0]]), "-v", "40", "-mi", "0",
                              "--log-dir", str(tmp_path / "logs")])
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert done.returncode == 0, done.stderr
    assert meta["termination_reason"] == "target reached" and len(rows) == 40
    assert {(row["device0"], row["device1"]) for row in rows} == {("cuda:0", "cuda:0")}
    assert [gpu["logical_index"] for gpu in meta["gpus"]] == [0] and meta["cuda_device_order"] == "PCI_BUS_ID"
    runners = [p for p in meta["processes"] if p["role"] == "runner"]
    assert all(p["device"] == "cuda:0" and p["peak_device_bytes"] > 0 for p in runners)
    assert runners[0]["output_device"] == "cuda:0"
    client = next(p for p in meta["processes"] if p["role"] == "client")
    assert (client["device_process_bytes"], client["device_outside_allocator_bytes"]) == (None, None)
    main = meta["gpus"][0]["main_process"]
    assert main["slot_bytes"] > 0 and main["left_after_release_bytes"] == 0  # every slot freed after the job
    assert "Producer process has been terminated" not in done.stderr  # every child released its CUDA slots
    if runners[0]["device_process_bytes"] is None:
        pytest.skip("NVML reports the pids of another pid namespace")
    # each runner's own CUDA context and library handles, apart from torch's allocator; the main process's too
    assert all(p["device_process_bytes"] >= p["device_outside_allocator_bytes"] > 2**20 for p in runners)
    assert main["device_process_bytes"] >= main["device_outside_allocator_bytes"] > 2**20


@pytest.mark.gpu
def test_a_gpu_step_read_only_by_the_cpu_writes_host_slots_and_main_holds_no_cuda_slot(
        tmp_path, job_log, benchmark_process):
    done = benchmark_process(["-c", _on_gpu(tmp_path, [[0], [-1]]), "-v", "20", "-mi", "0",
                              "--log-dir", str(tmp_path / "logs")])
    meta = job_log(tmp_path / "logs").meta
    assert done.returncode == 0, done.stderr
    step0 = next(p for p in meta["processes"] if p["name"] == "step0-g0-r0")
    assert step0["output_device"] == "cpu" and meta["gpus"][0]["main_process"] is None


JOBS_IN_ONE_PROCESS = textwrap.dedent("""
    import json, sys
    import torch
    from rnb import cli
    reserved = []
    for n in range(2):
        code = cli.main(["-c", sys.argv[1], "-v", "20", "-mi", "0", "--log-dir", sys.argv[2]])
        reserved.append((code, [torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())]))
    print(json.dumps(reserved))
""")


@pytest.mark.gpu
def test_a_process_that_runs_several_jobs_keeps_no_gpu_memory_and_torch_warns_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", JOBS_IN_ONE_PROCESS, _on_gpu(tmp_path, [[0], [0]]),
                           str(tmp_path / "logs")], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=child_environment())
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    # the second job's busy check did not refuse the first job's own context, and no slot stayed reserved
    assert runs == [[0, [0] * torch.cuda.device_count()], [0, [0] * torch.cuda.device_count()]]
    assert "Producer process has been terminated" not in done.stderr


@pytest.mark.gpu
def test_torch_numbers_the_gpus_as_nvml_does_and_a_runner_refuses_another_gpu():
    with Nvml() as nvml:
        assert [nvml.device(i).uuid for i in range(nvml.device_count())][: torch.cuda.device_count()] == [
            nvml_uuid(str(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())]
    with pytest.raises(GpuMismatchError, match=r"expected torch's cuda:0 to be NVML's GPU 0 \(GPU-not-this-one\)"):
        check_device_uuid(0, "GPU-not-this-one", "step0-g0-r0")


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
    plumbing.step_queues[0][0].put_nowait(Signal(0, 0, 0, 0, {}, TimeCard(0, "0")).wire())
    (received,) = transport.receive(timeout=10).tensors
    assert slots[0].tensors[0].device.type == received.device.type == "cpu"
    assert torch.equal(received, data) and slots[0].free.is_set()
