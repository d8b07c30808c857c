"""GPU validation: NVML replaced by a fake at the rnb.pipeline.gpus.Nvml seam, plus the real no-driver path."""
from __future__ import annotations

import dataclasses
import sys
from types import TracebackType

import pytest
import torch

from rnb.engines.local.driver import with_main_memory
from rnb.pipeline.config import ConfigError, PipelineConfig, parse_config
from rnb.pipeline.gpus import (
    DeviceState,
    GpuInfo,
    GpuRequestError,
    apply_cpu_override,
    busy_notes,
    device_memory_record,
    validate_gpus,
)
from rnb.pipeline.plan import plan_runners

GIB = 2**30


def _config(*groups_per_step: list[list[int]]) -> PipelineConfig:
    """A pipeline whose step k has one group per gpus list given for it."""
    last = len(groups_per_step) - 1
    steps = []
    for k, groups in enumerate(groups_per_step):
        steps.append({
            "model": "tests.fixture_models.Head" if k == last else "tests.fixture_models.Frames",
            "queue_groups": [
                {"gpus": gpus, **({"in_queue": 0} if k else {}), **({} if k == last else {"out_queues": [0]})}
                for gpus in groups
            ],
        })
    return parse_config({"pipeline": steps}, "gpu.json")


def _device(i: int, used: int = 0, pids: tuple[int, ...] = ()) -> DeviceState:
    return DeviceState(f"Fake GPU {i}", f"GPU-{i}{i}{i}-uuid", 80 * GIB, used, pids)


class FakeNvml:
    """Stands in for rnb.pipeline.gpus.Nvml: a fixed list of devices, and a log of what was asked."""

    def __init__(self, devices: list[DeviceState], fail: Exception | None = None) -> None:
        self.devices = devices
        self.fail = fail
        self.entered = 0
        self.exited = 0

    def __call__(self) -> FakeNvml:
        return self

    def __enter__(self) -> FakeNvml:
        self.entered += 1
        if self.fail is not None:
            raise self.fail
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.exited += 1

    def device_count(self) -> int:
        return len(self.devices)

    def device(self, physical_index: int) -> DeviceState:
        return self.devices[physical_index]

    def process_memory(self, uuid: str) -> dict[int, int]:
        return {4242: 900 * 2**20} if "GPU-111-uuid".endswith(uuid) else {}  # torch's uuid lacks NVML's prefix


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml([_device(i) for i in range(4)])
    monkeypatch.setattr("rnb.pipeline.gpus.Nvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml


def test_identity_mapping_without_cuda_visible_devices(fake: FakeNvml) -> None:
    infos = validate_gpus(_config([[2, 0, 2]], [[-1, 0]]), cpu_only=False)
    assert infos == [
        GpuInfo(2, 2, "Fake GPU 2", "GPU-222-uuid", 80 * GIB),
        GpuInfo(0, 0, "Fake GPU 0", "GPU-000-uuid", 80 * GIB),
    ]
    assert (fake.entered, fake.exited) == (1, 1)


def test_cuda_visible_devices_maps_logical_to_physical(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    infos = validate_gpus(_config([[0]], [[1]]), cpu_only=False)
    assert [(i.logical_index, i.physical_index, i.uuid) for i in infos] == [(0, 3, "GPU-333-uuid"), (1, 1, "GPU-111-uuid")]


def test_cuda_visible_devices_accepts_uuid_prefixes(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-222,GPU-000-uuid")
    infos = validate_gpus(_config([[1, 0]]), cpu_only=False)
    assert [(i.logical_index, i.physical_index) for i in infos] == [(1, 0), (0, 2)]


def test_logical_index_beyond_visible_list_names_the_variable(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[0]], [[-1, 1]]), cpu_only=False)
    assert str(caught.value) == (
        'gpu.json: pipeline[1].queue_groups[0].gpus[1]: expected GPU 1 to be visible, '
        'found only logical GPUs 0..0 visible through CUDA_VISIBLE_DEVICES="2"'
    )


@pytest.mark.parametrize("variable", ["", "7,0", "-1", "x", "GPU-9"])
def test_cuda_visible_devices_ends_at_the_first_invalid_entry(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", variable)
    with pytest.raises(GpuRequestError, match="found no GPU visible through CUDA_VISIBLE_DEVICES"):
        validate_gpus(_config([[0]]), cpu_only=False)


def test_cuda_visible_devices_repeat_ends_the_list(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,1,2")
    assert [i.physical_index for i in validate_gpus(_config([[0]]), cpu_only=False)] == [1]
    with pytest.raises(GpuRequestError, match=r"found only logical GPUs 0\.\.0 visible"):
        validate_gpus(_config([[1]]), cpu_only=False)


def test_mig_entries_are_refused(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc")
    with pytest.raises(GpuRequestError, match='found the MIG instance "MIG-abc"'):
        validate_gpus(_config([[0]]), cpu_only=False)


def test_missing_physical_gpu(fake: FakeNvml) -> None:
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[-1]], [[0, 5]]), cpu_only=False)
    assert str(caught.value) == "gpu.json: pipeline[1].queue_groups[0].gpus[1]: expected GPU 5 to exist, found 4 GPUs on this machine"
    assert fake.exited == 1


def test_busy_gpu_with_compute_processes(fake: FakeNvml) -> None:
    fake.devices[1] = _device(1, used=GIB // 100, pids=(4242, 4343))
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[1]]), cpu_only=False)
    assert caught.value.json_path == "pipeline[0].queue_groups[0].gpus[0]"
    assert caught.value.expected == ("expected GPU 1 (physical 1, Fake GPU 1) to be free, found compute processes on it "
                                     "(pids 4242, 4343); --allow-busy-gpus runs on it anyway")


def test_memory_threshold_default_and_override(fake: FakeNvml) -> None:
    fake.devices[0] = _device(0, used=8 * GIB)
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[0]]), cpu_only=False)
    assert caught.value.expected == (
        "expected GPU 0 (physical 0, Fake GPU 0) to have under 5% of its memory in use, found 8.0 GiB of 80.0 GiB in use; "
        "--allow-busy-gpus runs on it anyway"
    )
    assert [i.logical_index for i in validate_gpus(_config([[0]]), cpu_only=False, max_memory_fraction=0.2)] == [0]


def test_allow_busy_runs_on_a_busy_gpu_and_says_so(fake: FakeNvml) -> None:
    fake.devices[1] = _device(1, used=8 * GIB, pids=(4242,))
    infos = validate_gpus(_config([[1, 0]]), cpu_only=False, allow_busy=True)
    assert infos == [GpuInfo(1, 1, "Fake GPU 1", "GPU-111-uuid", 80 * GIB, 8 * GIB, (4242,)),
                     GpuInfo(0, 0, "Fake GPU 0", "GPU-000-uuid", 80 * GIB, 0, ())]
    assert busy_notes(infos) == [
        "--allow-busy-gpus: GPU 1 (physical 1, Fake GPU 1) was busy at the start (other compute processes: 4242; "
        "8.0 GiB of 80.0 GiB in use), so its figures share the GPU with them"]


def test_device_memory_record_splits_off_what_the_allocator_does_not_hold(fake: FakeNvml) -> None:
    assert device_memory_record("111-uuid", 4242, 600 * 2**20) == {
        "device_process_bytes": 900 * 2**20, "device_outside_allocator_bytes": 300 * 2**20}
    assert device_memory_record("111-uuid", 99, 0) == {"device_process_bytes": None,
                                                       "device_outside_allocator_bytes": None}
    fake.fail = RuntimeError("NVML Shared Library Not Found")
    assert device_memory_record("111-uuid", 4242, 0)["device_process_bytes"] is None


def test_the_job_log_says_what_the_main_process_holds_on_each_gpu_with_slots(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 0 writes its slots on GPU 1, the final step (no slots) runs on GPU 0: main has a context on GPU 1 only."""
    config = _config([[1]], [[0]])
    gpus = [dataclasses.asdict(info) for info in validate_gpus(config, cpu_only=False)]
    monkeypatch.setattr("os.getpid", lambda: 4242)
    monkeypatch.setattr("torch.cuda.memory_reserved", lambda device: {1: 600 * 2**20}[device])
    assert [(gpu["logical_index"], gpu["main_process"]) for gpu in with_main_memory(gpus, plan_runners(config, 1))] == [
        (1, {"device_process_bytes": 900 * 2**20, "device_outside_allocator_bytes": 300 * 2**20}), (0, None)]


def test_nvml_query_failure_is_one_sentence(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(physical_index: int) -> DeviceState:
        raise RuntimeError("GPU is lost")

    monkeypatch.setattr(fake, "device", lost)
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[3]]), cpu_only=False)
    assert str(caught.value) == (
        "gpu.json: pipeline[0].queue_groups[0].gpus[0]: expected NVML to describe the requested GPUs, "
        "found an error: GPU is lost"
    )
    assert fake.exited == 1


def test_nvml_init_failure_suggests_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rnb.pipeline.gpus.Nvml", FakeNvml([], fail=OSError("driver not loaded")))
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[-1]], [[-1, 1]]), cpu_only=False)
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value) == (
        "gpu.json: pipeline[1].queue_groups[0].gpus[1]: expected a usable NVIDIA GPU 1, found no usable NVIDIA GPU or "
        "driver on this machine (driver not loaded); write -1 in the config's gpus or pass --cpu to run on the CPU"
    )


def test_cpu_only_and_minus_one_never_load_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "py3nvml" or m.startswith("py3nvml.")]:
        monkeypatch.delitem(sys.modules, name)
    assert validate_gpus(_config([[0, 1]], [[2]]), cpu_only=True) == []
    assert validate_gpus(_config([[-1, -1]], [[-1]]), cpu_only=False) == []
    assert not [m for m in sys.modules if m.startswith("py3nvml")]


def test_cpu_override_keeps_replica_counts() -> None:
    config = _config([[0, 0, 1]], [[1], [-1, 2]])
    cpu = apply_cpu_override(config)
    assert [[g.gpus for g in s.queue_groups] for s in cpu.steps] == [[(-1, -1, -1)], [(-1,), (-1, -1)]]
    assert [[g.gpus for g in s.queue_groups] for s in config.steps] == [[(0, 0, 1)], [(1,), (-1, 2)]]
    assert cpu.raw == config.raw
    assert validate_gpus(cpu, cpu_only=False) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU, so NVML may initialise")
def test_real_nvml_without_driver_refuses_gpu_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[0]]), cpu_only=False)
    assert caught.value.json_path == "pipeline[0].queue_groups[0].gpus[0]"
    assert "found no usable NVIDIA GPU or driver on this machine" in caught.value.expected
    assert "write -1 in the config's gpus or pass --cpu" in caught.value.expected


@pytest.mark.gpu
def test_real_gpu_0_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    [info] = validate_gpus(_config([[0, 0]]), cpu_only=False, max_memory_fraction=1.0)
    assert (info.logical_index, info.physical_index) == (0, 0)
    assert info.name == torch.cuda.get_device_name(0)
    assert info.uuid.startswith("GPU-")
    assert info.memory_total_bytes >= torch.cuda.get_device_properties(0).total_memory
