"""The handful of NVML calls the harness makes, behind one seam tests replace, and the records they fill."""
from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType


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
