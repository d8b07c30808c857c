"""GPU validation: map the config's logical GPU indices to physical GPUs and check them.

Done in the main process before anything is spawned, through NVML rather than
CUDA, so that the main process never creates a CUDA context and a config that
asks for a missing or busy GPU costs one sentence and exit code 2.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType

from rnb.pipeline.config import ConfigError, PipelineConfig

DEFAULT_MAX_MEMORY_FRACTION = 0.05


class GpuRequestError(ConfigError):
    """The config asks for a GPU this machine cannot give it."""


@dataclass(frozen=True)
class GpuInfo:
    logical_index: int              # as written in the config
    physical_index: int             # NVML's index, after CUDA_VISIBLE_DEVICES
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int = 0      # when the job was checked: not 0 only where --allow-busy-gpus let it run
    compute_pids: tuple[int, ...] = ()  # other processes computing on it then, likewise


@dataclass(frozen=True)
class DeviceState:
    """What NVML reports about one physical GPU, as far as the check needs it."""

    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_pids: tuple[int, ...]


@dataclass(frozen=True)
class GpuUtilisation:
    """One NVML sample of a GPU while a job runs."""

    gpu_percent: int                # time a kernel ran over NVML's last sample period
    memory_used_bytes: int
    decoder_percent: int            # NVDEC busy over its sample period


class Nvml:
    """The handful of NVML calls the check makes, as one seam that tests replace.

    py3nvml is imported on entry only, so CPU-only runs never load the library.
    """

    def __enter__(self) -> Nvml:
        from py3nvml import py3nvml

        self._nv = py3nvml
        py3nvml.nvmlInit()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._nv.nvmlShutdown()

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def device(self, physical_index: int) -> DeviceState:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(physical_index)
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        return DeviceState(
            name=str(nv.nvmlDeviceGetName(handle)),
            uuid=str(nv.nvmlDeviceGetUUID(handle)),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            compute_pids=tuple(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)),
        )

    def process_memory(self, uuid: str) -> dict[int, int]:
        """Device memory each compute process holds on the GPU whose NVML UUID ends with `uuid`, by pid."""
        nv = self._nv
        for index in range(self.device_count()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            if str(nv.nvmlDeviceGetUUID(handle)).endswith(uuid):
                return {int(p.pid): int(p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
                        if p.usedGpuMemory is not None}
        return {}

    def utilisation(self, physical_index: int) -> GpuUtilisation:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(physical_index)
        rates = nv.nvmlDeviceGetUtilizationRates(handle)
        decoder, _period_us = nv.nvmlDeviceGetDecoderUtilization(handle)
        return GpuUtilisation(int(rates.gpu), int(nv.nvmlDeviceGetMemoryInfo(handle).used), int(decoder))


def validate_gpus(
    config: PipelineConfig, cpu_only: bool, max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION,
    allow_busy: bool = False,
) -> list[GpuInfo]:
    """Check every GPU the config asks for exists, is visible and is free; one GpuInfo per logical index.

    A GPU counts as free when no compute process runs on it and less than
    `max_memory_fraction` of its memory is in use: benchmark numbers taken next
    to another job would be meaningless. `allow_busy` (--allow-busy-gpus) lets
    a busy GPU run anyway, for a user who knows; what was found stays in the
    GpuInfo and busy_notes() says it in the job log.
    """
    requests = dict(_gpu_requests(config))
    if cpu_only or not requests:
        return []
    return _validate(config.path, requests, max_memory_fraction, allow_busy)


def check_assigned_gpu(file: str, json_path: str, max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION,
                       allow_busy: bool = False) -> GpuInfo:
    """The one GPU a scheduler gave this process (Ray names it in CUDA_VISIBLE_DEVICES), checked as a config's are.

    The Ray engine runs this in a task on each node that will host GPU
    runners, holding the GPU those runners will get; `json_path` names the
    config's gpus entry the GPU serves.
    """
    return _validate(file, {0: json_path}, max_memory_fraction, allow_busy)[0]


def visible_gpu_count() -> int:
    """How many GPUs CUDA would show a process here (after CUDA_VISIBLE_DEVICES); 0 without a driver."""
    try:
        with Nvml() as nvml:
            count = nvml.device_count()
            variable = os.environ.get("CUDA_VISIBLE_DEVICES")
            return count if variable is None else len(_visible_devices("", "", variable, nvml, count))
    except Exception:  # no driver or library, a MIG entry: no GPU to give a Ray node
        return 0


def _validate(file: str, requests: dict[int, str], max_memory_fraction: float, allow_busy: bool) -> list[GpuInfo]:
    """NVML's view of each requested logical GPU (index -> JSON path of its first mention), checked free."""
    first_logical, first_path = next(iter(requests.items()))
    with ExitStack() as stack:
        try:
            session = stack.enter_context(Nvml())
        except Exception as exc:  # NVML reports a missing driver or library through assorted exception types
            raise GpuRequestError(
                file, first_path,
                f"expected a usable NVIDIA GPU {first_logical}, found no usable NVIDIA GPU or driver on this machine "
                f"({exc}); write -1 in the config's gpus or pass --cpu to run on the CPU",
            ) from None
        try:
            return _check_all(file, session, requests, max_memory_fraction, allow_busy)
        except GpuRequestError:
            raise
        except Exception as exc:  # e.g. a GPU fallen off the bus: NVMLError subclasses
            raise GpuRequestError(
                file, first_path, f"expected NVML to describe the requested GPUs, found an error: {exc}"
            ) from None


def _check_all(file: str, nvml: Nvml, requests: dict[int, str], max_memory_fraction: float,
               allow_busy: bool) -> list[GpuInfo]:
    count = nvml.device_count()
    variable = os.environ.get("CUDA_VISIBLE_DEVICES")
    first_path = next(iter(requests.values()))
    visible = list(range(count)) if variable is None else _visible_devices(file, first_path, variable, nvml, count)
    infos = []
    for logical, path in requests.items():
        physical = _physical(file, logical, path, visible, variable, count)
        infos.append(_check_one(file, nvml, logical, path, physical, max_memory_fraction, allow_busy))
    return infos


def device_memory_record(uuid: str, pid: int, allocator_reserved_bytes: int) -> dict[str, int | None]:
    """What a process holds on one GPU as NVML sees it, and how much of it lies outside torch's allocator.

    The part outside the caching allocator is the CUDA context itself plus what
    libraries hold on their own (cuDNN and cuBLAS handles, NVDEC's surfaces):
    the price of one more process on the GPU. None where NVML cannot tell, for
    instance when it reports the process under another PID namespace's pid.
    """
    try:
        with Nvml() as nvml:
            held = nvml.process_memory(uuid).get(pid)
    except Exception:  # NVML errors come as assorted types; the figure is then unknown, not fatal
        held = None
    outside = None if held is None else max(0, held - allocator_reserved_bytes)
    return {"device_process_bytes": held, "device_outside_allocator_bytes": outside}


def apply_cpu_override(config: PipelineConfig) -> PipelineConfig:
    """Every runner on the CPU (--cpu), keeping each group's replica count."""
    steps = tuple(
        dataclasses.replace(
            step,
            queue_groups=tuple(dataclasses.replace(group, gpus=(-1,) * len(group.gpus)) for group in step.queue_groups),
        )
        for step in config.steps
    )
    return dataclasses.replace(config, steps=steps)


def _gpu_requests(config: PipelineConfig) -> Iterator[tuple[int, str]]:
    """Each logical GPU index with the JSON path of its first mention, in config order."""
    seen: set[int] = set()
    for k, step in enumerate(config.steps):
        for g, group in enumerate(step.queue_groups):
            for i, gpu in enumerate(group.gpus):
                if gpu >= 0 and gpu not in seen:
                    seen.add(gpu)
                    yield gpu, f"pipeline[{k}].queue_groups[{g}].gpus[{i}]"


def _physical(file: str, logical: int, path: str, visible: list[int], variable: str | None, count: int) -> int:
    if logical < len(visible):
        return visible[logical]
    if variable is None:
        raise GpuRequestError(file, path, f"expected GPU {logical} to exist, found {count} GPUs on this machine")
    shown = f"only logical GPUs 0..{len(visible) - 1}" if visible else "no GPU"
    raise GpuRequestError(
        file, path,
        f'expected GPU {logical} to be visible, found {shown} visible through CUDA_VISIBLE_DEVICES="{variable}"',
    )


def _check_one(file: str, nvml: Nvml, logical: int, path: str, physical: int, max_memory_fraction: float,
               allow_busy: bool) -> GpuInfo:
    state = nvml.device(physical)
    where = f"GPU {logical} (physical {physical}, {state.name})"
    others = tuple(pid for pid in state.compute_pids if pid != os.getpid())
    if others and not allow_busy:
        pids = ", ".join(str(pid) for pid in others)
        raise GpuRequestError(file, path, f"expected {where} to be free, found compute processes on it (pids {pids}); "
                                          "--allow-busy-gpus runs on it anyway")
    if state.memory_used_bytes > max_memory_fraction * state.memory_total_bytes and not allow_busy:
        raise GpuRequestError(
            file, path,
            f"expected {where} to have under {max_memory_fraction:.0%} of its memory in use, "
            f"found {state.memory_used_bytes / 2**30:.1f} GiB of {state.memory_total_bytes / 2**30:.1f} GiB in use; "
            "--allow-busy-gpus runs on it anyway",
        )
    return GpuInfo(logical, physical, state.name, state.uuid, state.memory_total_bytes, state.memory_used_bytes, others)


def busy_notes(infos: list[GpuInfo], max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION) -> list[str]:
    """One job-log note per GPU that was busy when the job was checked (only --allow-busy-gpus lets one run)."""
    notes = []
    for info in infos:
        if info.compute_pids or info.memory_used_bytes > max_memory_fraction * info.memory_total_bytes:
            pids = ", ".join(str(pid) for pid in info.compute_pids) or "none"
            notes.append(f"--allow-busy-gpus: GPU {info.logical_index} (physical {info.physical_index}, {info.name}) "
                         f"was busy at the start (other compute processes: {pids}; "
                         f"{info.memory_used_bytes / 2**30:.1f} GiB of {info.memory_total_bytes / 2**30:.1f} GiB "
                         "in use), so its figures share the GPU with them")
    return notes


def _visible_devices(file: str, path: str, variable: str, nvml: Nvml, count: int) -> list[int]:
    """Physical indices CUDA will expose, in logical order.

    Follows CUDA's rule that the list ends at the first entry that names no
    device (an index out of range, a repeat, an unknown UUID). Entries may be
    indices or (prefixes of) GPU UUIDs; MIG instances are not supported.
    """
    uuids: list[str] | None = None
    visible: list[int] = []
    for entry in (part.strip() for part in variable.split(",")):
        if entry.startswith("MIG-"):
            raise GpuRequestError(
                file, path,
                f'expected GPU indices or GPU UUIDs in CUDA_VISIBLE_DEVICES, found the MIG instance "{entry}"',
            )
        if entry.startswith("GPU-"):
            if uuids is None:
                uuids = [nvml.device(i).uuid for i in range(count)]
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            physical = matches[0] if len(matches) == 1 else -1
        else:
            physical = int(entry) if entry.isascii() and entry.isdigit() else -1
        if not 0 <= physical < count or physical in visible:
            break
        visible.append(physical)
    return visible
