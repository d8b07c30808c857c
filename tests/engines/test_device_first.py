"""A runner's CUDA device is current before any CUDA argument is unpickled (shared_memory_transport.DeviceFirst)."""
from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from rnb.engines.local import shared_memory_transport as local
from rnb.engines.local.shared_memory_transport import DeviceFirst
from rnb.pipeline.gpus import Nvml

LOADED: list[tuple[str, str]] = []


def _record(name: str) -> str:
    LOADED.append(("loaded", name))
    return name


class Slots:
    """Stands in for a runner's CUDA slots: unpickling it leaves a mark."""

    def __reduce__(self) -> tuple:
        return _record, ("slots",)


def test_the_device_is_selected_before_the_arguments_after_it_are_unpickled(monkeypatch):
    data = pickle.dumps((DeviceFirst("cuda:1"), Slots(), "spec"))
    LOADED.clear()
    monkeypatch.setattr(local, "select_device", lambda device: LOADED.append(("device", device)) or device)
    assert pickle.loads(data) == ("cuda:1", "slots", "spec")
    assert LOADED == [("device", "cuda:1"), ("loaded", "slots")]


def test_the_cpu_selects_nothing():
    assert pickle.loads(pickle.dumps(DeviceFirst("cpu"))) == "cpu"


def _report_device(device: str, tensor: torch.Tensor, answers: Any, done: Any) -> None:
    answers.put((device, torch.cuda.current_device(), tensor.device.index, os.getpid()))
    done.wait(60)  # alive while the parent asks NVML which GPUs this process holds


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="on GPU 0 alone a stray context on GPU 0 cannot show")
def test_a_spawned_runner_receives_its_tensors_on_its_own_gpu_and_holds_nothing_on_gpu_0():
    last = torch.cuda.device_count() - 1
    ctx = mp.get_context("spawn")
    answers, done = ctx.Queue(), ctx.Event()
    tensor = torch.ones(4, device=f"cuda:{last}")
    process = ctx.Process(target=_report_device, args=(DeviceFirst(f"cuda:{last}"), tensor, answers, done))
    process.start()
    try:
        device, current, index, pid = answers.get(timeout=120)
        assert (device, current, index) == (f"cuda:{last}", last, last)
        with Nvml() as nvml:
            if pid not in nvml.process_memory(str(torch.cuda.get_device_properties(last).uuid)):
                pytest.skip("NVML reports the pids of another pid namespace")
            assert pid not in nvml.process_memory(str(torch.cuda.get_device_properties(0).uuid))
    finally:
        done.set()
        process.join(60)
