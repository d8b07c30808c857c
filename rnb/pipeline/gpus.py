"""GPU validation: map the config's logical GPU indices to physical GPUs and check them.

Done in the main process before anything is spawned, through NVML rather than
CUDA, so that the main process never creates a CUDA context and a config that
asks for a missing or busy GPU costs one sentence and exit code 2.

Busy means used by a stranger.  The processes NVML lists on a GPU may
include the checking process itself and those that started it (a bench or
pytest that already ran CUDA work, then starts a job): they are the job's
own (`Family`).  Inside a container with its own pid namespace NVML reports
host pids, which match nothing here; then the family's CUDA contexts are
counted instead: this process's own, and those its ancestors declared in
the environment they started it with (`child_environment`).

CUDA and NVML must number GPUs alike, or the GPU checked free is not the
GPU a runner uses: CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's order NVML's,
and `check_cuda_numbering` (the main process) and `check_device_uuid` (each
runner) compare torch's UUID of each logical GPU with NVML's.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType

import psutil

from rnb.core.records import GpuRecord
from rnb.pipeline.config_records import ConfigError, PipelineConfig

DEFAULT_MAX_MEMORY_FRACTION = 0.05
# CUDA's numbering of GPUs that is NVML's: set for the main process, every child and every Ray actor and task.
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# GPU UUIDs (NVML's form), one per CUDA context that the processes which started this one hold, comma-separated.
ANCESTOR_CONTEXTS_ENV = "RNB_ANCESTOR_GPU_CONTEXTS"


class GpuRequestError(ConfigError):
    """The config asks for a GPU this machine cannot give it."""


class GpuMismatchError(RuntimeError):
    """A runner's CUDA device is not the GPU the job checked (CUDA and NVML number GPUs differently)."""


@dataclass(frozen=True)
class DeviceState:
    """What NVML reports about one physical GPU, as far as the check needs it."""

    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_pids: tuple[int, ...] | None  # None where NVML could not list them (process_query_error says why)
    process_query_error: str = ""


@dataclass(frozen=True)
class GpuUtilisation:
    """One NVML sample of a GPU while a job runs."""

    gpu_percent: int                # time a kernel ran over NVML's last sample period
    memory_used_bytes: int
    decoder_percent: int            # NVDEC busy over its sample period
    power_watts: float | None = None   # the board's power draw; None where NVML does not report it


def nvml_uuid(uuid: str) -> str:
    """A GPU UUID in NVML's form, "GPU-..." (torch's lacks the prefix)."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def contexts_here() -> list[str]:
    """The GPUs (NVML UUIDs) on which this process holds a CUDA context: none unless torch has initialised CUDA.

    Asking creates no context: torch's primary-context query reads the driver's state of each device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return [nvml_uuid(str(torch.cuda.get_device_properties(index).uuid)) for index in range(torch.cuda.device_count())
            if torch._C._cuda_hasPrimaryContext(index)]


def _declared(environ: Mapping[str, str]) -> list[str]:
    return [uuid for uuid in environ.get(ANCESTOR_CONTEXTS_ENV, "").split(",") if uuid]


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a job this process starts as a subprocess (a bench, a test, a tool).

    GPUs are numbered as NVML numbers them, and this process's CUDA contexts
    (with those its own ancestors declared) are declared as the job's own, so
    that the job's busy check does not take them for a stranger's where NVML
    reports pids of another namespace.
    """
    env = dict(os.environ if base is None else base)
    for key, value in DEVICE_ORDER.items():
        env.setdefault(key, value)
    held = [*_declared(env), *contexts_here()]
    if held:
        env[ANCESTOR_CONTEXTS_ENV] = ",".join(held)
    return env


@dataclass(frozen=True)
class Strangers:
    """The compute processes on one GPU that are not the job's own."""

    count: int
    pids: tuple[int, ...]  # the strangers' own where NVML shares this pid namespace; else every pid it listed as unknown
    unseen: int            # the job's own contexts that NVML listed under pids of another namespace (0: pids compared)

    def __bool__(self) -> bool:
        return self.count > 0

    def describe(self) -> str:
        pids = ", ".join(str(pid) for pid in self.pids)
        if not self.unseen:
            return f"compute processes on it (pids {pids})"
        return (f"{self.count} compute process(es) on it besides this job's own {self.unseen} (NVML reports pids of "
                f"another pid namespace: {pids})")


@dataclass(frozen=True)
class Family:
    """The processes whose CUDA contexts count as the job's own: this one, those that started it, what they declared."""

    pids: frozenset[int]
    contexts: Mapping[str, int]  # NVML UUID -> CUDA contexts the family holds on that GPU (as far as it knows)

    @staticmethod
    def here(environ: Mapping[str, str] | None = None, held: Callable[[], list[str]] | None = None) -> Family:
        pids = {os.getpid()}
        try:
            pids.update(parent.pid for parent in psutil.Process().parents())
        except psutil.Error:  # a parent gone meanwhile: the ones found still count
            pass
        counts: dict[str, int] = {}
        for uuid in [*_declared(os.environ if environ is None else environ), *(held or contexts_here)()]:
            counts[uuid] = counts.get(uuid, 0) + 1
        return Family(frozenset(pids), counts)

    def strangers(self, uuid: str, listed: tuple[int, ...]) -> Strangers:
        """Who else computes on the GPU `uuid`, given the pids NVML lists on it.

        A listed pid of the family is its own.  Contexts the family holds but
        NVML did not list under a family pid were listed under pids of another
        namespace: that many of the unknown pids are the family's too.
        """
        unknown = tuple(pid for pid in listed if pid not in self.pids)
        unseen = max(0, self.contexts.get(uuid, 0) - (len(listed) - len(unknown)))
        return Strangers(max(0, len(unknown) - unseen), unknown, unseen)


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
        try:
            pids: tuple[int, ...] | None = tuple(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle))
            error = ""
        except Exception as exc:  # e.g. NVML_ERROR_NOT_SUPPORTED under a sandboxed runtime: unknown, not fatal
            pids, error = None, f"{type(exc).__name__}: {exc}"
        return DeviceState(
            name=str(nv.nvmlDeviceGetName(handle)),
            uuid=str(nv.nvmlDeviceGetUUID(handle)),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            compute_pids=pids,
            process_query_error=error,
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
        try:
            power: float | None = int(nv.nvmlDeviceGetPowerUsage(handle)) / 1000.0   # NVML gives milliwatts
        except Exception:  # NVML_ERROR_NOT_SUPPORTED on boards without a power sensor (and MIG slices)
            power = None
        return GpuUtilisation(int(rates.gpu), int(nv.nvmlDeviceGetMemoryInfo(handle).used), int(decoder), power)


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
