"""GPU validation: map the config's logical GPU indices to physical GPUs and check them.

Done in the main process before anything is spawned, through NVML rather than
CUDA (rnb.pipeline.nvml), so that the main process never creates a CUDA
context and a config that asks for a missing or busy GPU costs one sentence
and exit code 2.  Busy means used by a stranger: a process not of the job's
own family (rnb.pipeline.gpu_family).

CUDA and NVML must number GPUs alike, or the GPU checked free is not the
GPU a runner uses: CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's order NVML's,
and `check_cuda_numbering` (the main process) and `check_device_uuid` (each
runner) compare torch's UUID of each logical GPU with NVML's.

The engines, benches and tests take the GPU names of all three modules from
here.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

from rnb.core.records import GpuRecord
from rnb.pipeline.config_records import ConfigError, PipelineConfig
from rnb.pipeline.gpu_family import DEVICE_ORDER, Family, child_environment
from rnb.pipeline.nvml import DeviceState, GpuUtilisation, Nvml, nvml_uuid

__all__ = ["DEFAULT_MAX_MEMORY_FRACTION", "DEVICE_ORDER", "DeviceMemory", "DeviceState", "GpuMismatchError",
           "GpuRequestError", "GpuUtilisation", "Nvml", "apply_cpu_override", "busy_notes", "check_assigned_gpu",
           "check_cuda_numbering", "check_device_uuid", "child_environment", "device_memory_record", "mismatch",
           "nvml_uuid", "validate_gpus", "visible_gpu_count"]

DEFAULT_MAX_MEMORY_FRACTION = 0.05


class GpuRequestError(ConfigError):
    """The config asks for a GPU this machine cannot give it."""


class GpuMismatchError(RuntimeError):
    """A runner's CUDA device is not the GPU the job checked (CUDA and NVML number GPUs differently)."""


def validate_gpus(
    config: PipelineConfig, cpu_only: bool, max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION,
    allow_busy: bool = False,
) -> list[GpuRecord]:
    """Check every GPU the config asks for exists, is visible and is free; one GpuRecord per logical index.

    A GPU counts as free when no stranger's compute process runs on it (the
    job's own family's do not count: `Family`) and less than
    `max_memory_fraction` of its memory is in use: benchmark numbers taken next
    to another job would be meaningless. `allow_busy` (--allow-busy-gpus) lets
    a busy GPU run anyway, for a user who knows; what was found stays in the
    GpuRecord and busy_notes() says it in the job log.
    """
    requests = dict(_gpu_requests(config))
    if cpu_only or not requests:
        return []
    return _validate(config.path, requests, max_memory_fraction, allow_busy)


def check_assigned_gpu(file: str, json_path: str, max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION,
                       allow_busy: bool = False) -> GpuRecord:
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


def _validate(file: str, requests: dict[int, str], max_memory_fraction: float, allow_busy: bool) -> list[GpuRecord]:
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
               allow_busy: bool) -> list[GpuRecord]:
    count = nvml.device_count()
    variable = os.environ.get("CUDA_VISIBLE_DEVICES")
    first_path = next(iter(requests.values()))
    visible = list(range(count)) if variable is None else _visible_devices(file, first_path, variable, nvml, count)
    family = Family.here()
    infos = []
    for logical, path in requests.items():
        physical = _physical(file, logical, path, visible, variable, count)
        infos.append(_check_one(file, nvml, logical, path, physical, max_memory_fraction, allow_busy, family))
    return infos


@dataclass(frozen=True)
class DeviceMemory:
    """What a process holds on one GPU as NVML sees it, and how much of it lies outside torch's allocator."""

    device_process_bytes: int | None
    device_outside_allocator_bytes: int | None


def device_memory_record(uuid: str, pid: int, allocator_reserved_bytes: int) -> DeviceMemory:
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
    return DeviceMemory(held, None if held is None else max(0, held - allocator_reserved_bytes))


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
               allow_busy: bool, family: Family) -> GpuRecord:
    state = nvml.device(physical)
    where = f"GPU {logical} (physical {physical}, {state.name})"
    others = family.strangers(state.uuid, state.compute_pids or ())
    if others and not allow_busy:
        raise GpuRequestError(file, path, f"expected {where} to be free, found {others.describe()}; "
                                          "--allow-busy-gpus runs on it anyway")
    if state.memory_used_bytes > max_memory_fraction * state.memory_total_bytes and not allow_busy:
        raise GpuRequestError(
            file, path,
            f"expected {where} to have under {max_memory_fraction:.0%} of its memory in use, "
            f"found {state.memory_used_bytes / 2**30:.1f} GiB of {state.memory_total_bytes / 2**30:.1f} GiB in use; "
            "--allow-busy-gpus runs on it anyway",
        )
    return GpuRecord(logical, physical, state.name, state.uuid, state.memory_total_bytes, state.memory_used_bytes,
                     others.pids if others else (), process_query_error=state.process_query_error)


def check_cuda_numbering(config: PipelineConfig, gpus: list[GpuRecord],
                         torch_uuid: Callable[[int], str] | None = None) -> None:
    """The main process: torch's UUID of each logical GPU the job uses must be NVML's (exit 2 otherwise).

    Reading a device's properties runs nothing on it.  A mismatch means CUDA
    numbers the GPUs differently from NVML (CUDA_DEVICE_ORDER set to
    FASTEST_FIRST, or a CUDA_VISIBLE_DEVICES that the two read differently):
    the GPU checked free would not be the GPU a runner computes on.
    """
    paths = dict(_gpu_requests(config))
    for gpu in gpus:
        where = f"GPU {gpu.logical_index} (physical {gpu.physical_index}, {gpu.name})"
        try:
            found = nvml_uuid((torch_uuid or _torch_uuid)(gpu.logical_index))
        except Exception as error:  # torch without CUDA, or a driver torch cannot use: as assorted types
            raise GpuRequestError(config.path, paths[gpu.logical_index],
                                  f"expected torch to see {where} as cuda:{gpu.logical_index}, found that it cannot "
                                  f"({type(error).__name__}: {error})") from None
        if found != gpu.uuid:
            raise GpuRequestError(config.path, paths[gpu.logical_index], mismatch(gpu.logical_index, gpu.uuid, found))


def mismatch(index: int, expected: str, found: str) -> str:
    order = os.environ.get("CUDA_DEVICE_ORDER")
    return (f"expected torch's cuda:{index} to be NVML's GPU {index} ({expected}), found {found} "
            f"(CUDA_DEVICE_ORDER={order or 'unset'}); CUDA and NVML number the GPUs differently: "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID")


def check_device_uuid(index: int, expected: str, where: str, torch_uuid: Callable[[int], str] | None = None) -> None:
    """A runner at start: its CUDA device `cuda:index` must be the GPU the job checked (NVML UUID `expected`)."""
    found = nvml_uuid((torch_uuid or _torch_uuid)(index))
    if found != expected:
        raise GpuMismatchError(f"{where}: {mismatch(index, expected, found)}")


def _torch_uuid(index: int) -> str:
    import torch  # only where a GPU is asked for: CPU-only runs need no CUDA

    return str(torch.cuda.get_device_properties(index).uuid)


def busy_notes(infos: list[GpuRecord], max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION) -> list[str]:
    """One job-log note per GPU that was busy when the job was checked, or whose compute processes NVML could not list.

    Only --allow-busy-gpus lets a busy GPU run; one whose processes are unknown runs, and its note says so.
    """
    notes = []
    for info in infos:
        if info.process_query_error:
            notes.append(f"GPU {info.logical_index} (physical {info.physical_index}, {info.name}): NVML could not list "
                         f"its compute processes ({info.process_query_error}), so whether another process computed on "
                         "it is unknown")
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
