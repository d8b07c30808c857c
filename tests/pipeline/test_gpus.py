"""GPU validation: NVML replaced by a fake at the rnb.pipeline.gpus.Nvml seam, plus the real no-driver path."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace, TracebackType

import pytest
import torch

from rnb.core.records import GpuRecord, MainGpuMemory
from rnb.engines.job import JobBook
from rnb.engines.local.driver import with_main_memory, with_release
from rnb.pipeline.config import ConfigError, PipelineConfig, parse_config
from rnb.pipeline.gpu_family import ANCESTOR_CONTEXTS_ENV, Family
from rnb.pipeline.gpus import (
    DeviceMemory,
    DeviceState,
    GpuMismatchError,
    GpuRequestError,
    Nvml,
    apply_cpu_override,
    busy_notes,
    check_cuda_numbering,
    check_device_uuid,
    child_environment,
    device_memory_record,
    validate_gpus,
)
from rnb.pipeline.plan import plan_runners, with_device_uuids

GIB = 2**30


def _config(*groups_per_step: list[list[int]]) -> PipelineConfig:
    """A pipeline whose step k has one group per gpus list given for it."""
    last = len(groups_per_step) - 1
    steps = []
    for k, groups in enumerate(groups_per_step):
        steps.append({
            "model": "tests.support.fixture_models.Head" if k == last else "tests.support.fixture_models.Frames",
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
        GpuRecord(2, 2, "Fake GPU 2", "GPU-222-uuid", 80 * GIB),
        GpuRecord(0, 0, "Fake GPU 0", "GPU-000-uuid", 80 * GIB),
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
def test_cuda_visible_devices_ends_at_the_first_invalid_entry(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch,
                                                              variable: str) -> None:
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
    assert str(caught.value) == ("gpu.json: pipeline[1].queue_groups[0].gpus[1]: expected GPU 5 to exist, "
                                 "found 4 GPUs on this machine")
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
    assert infos == [GpuRecord(1, 1, "Fake GPU 1", "GPU-111-uuid", 80 * GIB, 8 * GIB, (4242,)),
                     GpuRecord(0, 0, "Fake GPU 0", "GPU-000-uuid", 80 * GIB, 0, ())]
    assert busy_notes(infos) == [
        "--allow-busy-gpus: GPU 1 (physical 1, Fake GPU 1) was busy at the start (other compute processes: 4242; "
        "8.0 GiB of 80.0 GiB in use), so its figures share the GPU with them"]


def test_device_memory_record_splits_off_what_the_allocator_does_not_hold(fake: FakeNvml) -> None:
    assert device_memory_record("111-uuid", 4242, 600 * 2**20) == DeviceMemory(900 * 2**20, 300 * 2**20)
    assert device_memory_record("111-uuid", 99, 0) == DeviceMemory(None, None)
    fake.fail = RuntimeError("NVML Shared Library Not Found")
    assert device_memory_record("111-uuid", 4242, 0).device_process_bytes is None


def test_the_job_log_says_what_the_main_process_holds_on_each_gpu_with_slots(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 0 writes its slots on GPU 1, the final step (no slots) runs on GPU 0: main has a context on GPU 1 only."""
    config = _config([[1]], [[0]])
    gpus = validate_gpus(config, cpu_only=False)
    monkeypatch.setattr("os.getpid", lambda: 4242)
    monkeypatch.setattr("torch.cuda.memory_reserved", lambda device: {1: 600 * 2**20}[device])
    placements = plan_runners(config, 1)
    slots = 10 * 4 * 4  # tests.support.fixture_models.Frames: 10 slots of one float32 (1, 4) tensor
    held = with_main_memory(gpus, placements)
    assert [(gpu.logical_index, gpu.main_process) for gpu in held] == [
        (1, MainGpuMemory(900 * 2**20, 300 * 2**20, slots)), (0, None)]
    book = JobBook()
    released = with_release(held, {1: 0, 0: 0}, book)
    assert released[0].main_process == MainGpuMemory(900 * 2**20, 300 * 2**20, slots, 0) and book.notes == []
    kept = with_release(held, {1: 2**21}, book)
    assert kept[0].main_process is not None and kept[0].main_process.left_after_release_bytes == 2**21
    assert book.notes == ["GPU 1: 2 MiB of CUDA slots stayed with the main process after the job: a runner that held "
                          "them was killed before it could release them, so torch's CUDA IPC keeps them until this "
                          "process exits"]


def test_a_gpu_record_reads_back_as_written() -> None:
    record = GpuRecord(1, 3, "Fake GPU 3", "GPU-333-uuid", 80 * GIB, GIB, (7, 8), MainGpuMemory(5, 4, 3, 0))
    assert GpuRecord.from_json(record.to_json(), "meta.json") == record
    assert GpuRecord.from_json({"logical_index": 0}, "meta.json") == GpuRecord(0, 0, "", "", 0)


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


class _Py3nvmlRefusingProcesses:
    """py3nvml as a sandboxed runtime may answer: a device it describes, and its compute processes refused."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * GIB, used=GIB // 100)

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "Sandboxed GPU"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-000-uuid"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        raise RuntimeError("Not Supported")


def test_a_failed_process_query_is_unknown_and_a_note_not_a_refusal(fake: FakeNvml) -> None:
    nvml = Nvml()
    nvml._nv = _Py3nvmlRefusingProcesses()  # the library as it answered, without loading it
    state = nvml.device(0)
    assert (state.compute_pids, state.process_query_error) == (None, "RuntimeError: Not Supported")
    fake.devices[0] = state
    [gpu] = validate_gpus(_config([[0]]), cpu_only=False)
    assert (gpu.compute_pids, gpu.process_query_error) == ((), "RuntimeError: Not Supported")
    assert GpuRecord.from_json(gpu.to_json(), "meta.json") == gpu
    assert busy_notes([gpu]) == [
        "GPU 0 (physical 0, Sandboxed GPU): NVML could not list its compute processes (RuntimeError: Not Supported), "
        "so whether another process computed on it is unknown"]


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


def _family(pids: set[int], **contexts: int) -> Family:
    return Family(frozenset(pids), {f"GPU-{key}-uuid": count for key, count in contexts.items()})


def test_the_job_s_own_processes_are_not_strangers_where_nvml_shares_the_pid_namespace() -> None:
    family = _family({100, 10})  # this process (100) and the one that started it (10, a bench or pytest)
    assert not family.strangers("GPU-000-uuid", (100, 10))
    others = family.strangers("GPU-000-uuid", (100, 4242))
    assert (others.count, others.pids, others.describe()) == (1, (4242,), "compute processes on it (pids 4242)")


def test_where_nvml_reports_host_pids_the_job_s_own_contexts_are_counted() -> None:
    family = _family({100, 10}, **{"000": 2})  # its own context and its parent's, declared
    assert not family.strangers("GPU-000-uuid", (90100, 90010))  # both listed under host pids
    others = family.strangers("GPU-000-uuid", (90100, 90010, 95555))
    assert others.count == 1 and others.describe() == (
        "1 compute process(es) on it besides this job's own 2 (NVML reports pids of another pid namespace: "
        "90100, 90010, 95555)")
    assert family.strangers("GPU-111-uuid", (90100,)).count == 1  # its contexts are on GPU 0, not 1


def test_the_family_is_this_process_its_ancestors_and_what_they_declared() -> None:
    family = Family.here({ANCESTOR_CONTEXTS_ENV: "GPU-000-uuid,GPU-000-uuid,GPU-111-uuid"}, held=lambda: ["GPU-111-uuid"])
    assert os.getpid() in family.pids and os.getppid() in family.pids
    assert family.contexts == {"GPU-000-uuid": 2, "GPU-111-uuid": 2}


def test_a_job_started_from_a_process_holding_a_context_sees_it_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rnb.pipeline.gpu_family.contexts_here", lambda: ["GPU-000-uuid"])
    env = child_environment({ANCESTOR_CONTEXTS_ENV: "GPU-111-uuid"})
    assert env == {ANCESTOR_CONTEXTS_ENV: "GPU-111-uuid,GPU-000-uuid", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert child_environment({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_a_busy_check_in_another_namespace_refuses_only_strangers(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rnb.pipeline.gpu_family.contexts_here", lambda: ["GPU-111-uuid"])  # this process holds one
    fake.devices[1] = _device(1, pids=(987654,))  # NVML lists it under its host pid
    assert [gpu.compute_pids for gpu in validate_gpus(_config([[1]]), cpu_only=False)] == [()]
    fake.devices[1] = _device(1, pids=(987654, 987655))
    with pytest.raises(GpuRequestError) as caught:
        validate_gpus(_config([[1]]), cpu_only=False)
    assert caught.value.expected == (
        "expected GPU 1 (physical 1, Fake GPU 1) to be free, found 1 compute process(es) on it besides this job's own "
        "1 (NVML reports pids of another pid namespace: 987654, 987655); --allow-busy-gpus runs on it anyway")


def test_torch_and_nvml_must_number_the_gpus_alike(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config([[0, 1]])
    gpus = validate_gpus(config, cpu_only=False)
    check_cuda_numbering(config, gpus, torch_uuid=lambda index: f"{index}{index}{index}-uuid")  # torch's lacks "GPU-"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with pytest.raises(GpuRequestError) as caught:
        check_cuda_numbering(config, gpus, torch_uuid=lambda index: f"{1 - index}{1 - index}{1 - index}-uuid")
    assert str(caught.value) == (
        "gpu.json: pipeline[0].queue_groups[0].gpus[0]: expected torch's cuda:0 to be NVML's GPU 0 (GPU-000-uuid), "
        "found GPU-111-uuid (CUDA_DEVICE_ORDER=FASTEST_FIRST); CUDA and NVML number the GPUs differently: "
        "set CUDA_DEVICE_ORDER=PCI_BUS_ID")

    def no_cuda(index: int) -> str:
        raise RuntimeError("Found no NVIDIA driver on your system")
    with pytest.raises(GpuRequestError, match=r"gpus\[0\]: expected torch to see GPU 0 \(physical 0, Fake GPU 0\) as "
                                              r"cuda:0, found that it cannot \(RuntimeError: Found no NVIDIA driver"):
        check_cuda_numbering(config, gpus, torch_uuid=no_cuda)


def test_a_runner_on_another_gpu_than_the_one_checked_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    check_device_uuid(0, "GPU-000-uuid", "step1-g0-r0", torch_uuid=lambda index: "000-uuid")
    with pytest.raises(GpuMismatchError) as caught:
        check_device_uuid(0, "GPU-000-uuid", "step1-g0-r0", torch_uuid=lambda index: "111-uuid")
    assert str(caught.value) == (
        "step1-g0-r0: expected torch's cuda:0 to be NVML's GPU 0 (GPU-000-uuid), found GPU-111-uuid "
        "(CUDA_DEVICE_ORDER=unset); CUDA and NVML number the GPUs differently: set CUDA_DEVICE_ORDER=PCI_BUS_ID")


def test_a_gpu_producer_read_only_by_cpu_runners_keeps_its_slots_in_host_memory() -> None:
    """No CPU runner opens a CUDA context to read a slot: a GPU step whose readers are all on the CPU writes host slots."""
    to_cpu = plan_runners(_config([[0, 1]], [[-1]]), 1)
    assert [(p.device, p.output_device) for p in to_cpu] == [("cuda:0", "cpu"), ("cuda:1", "cpu"), ("cpu", "cpu")]
    mixed = plan_runners(_config([[0]], [[-1, 0]]), 1)  # one reader on the GPU: the slots stay there
    assert [(p.device, p.output_device) for p in mixed] == [("cuda:0", "cuda:0"), ("cpu", "cpu"), ("cuda:0", "cuda:0")]
    chain = plan_runners(_config([[0]], [[0]], [[-1]]), 1)
    assert [p.output_device for p in chain] == ["cuda:0", "cpu", "cpu"]


def test_each_gpu_runner_learns_the_uuid_of_its_gpu() -> None:
    placements = with_device_uuids(plan_runners(_config([[1, -1]], [[0]]), 1), {0: "GPU-000-uuid", 1: "GPU-111-uuid"})
    assert [(p.device, p.device_uuid) for p in placements] == [("cuda:1", "GPU-111-uuid"), ("cpu", ""),
                                                               ("cuda:0", "GPU-000-uuid")]
