"""A stand-in for NVML at rnb.pipeline.gpus.Nvml: the sampler's and the analysis' tests script what each GPU reads."""
from __future__ import annotations

from types import TracebackType

from rnb.pipeline.gpus import GpuUtilisation


class FakeNvml:
    """Stands in for rnb.pipeline.gpus.Nvml: scripted utilisation per physical GPU, one reading per call."""

    def __init__(self, readings: dict[int, list[GpuUtilisation]]) -> None:
        self.readings = {index: list(values) for index, values in readings.items()}
        self.asked: list[int] = []

    def __call__(self) -> FakeNvml:
        return self

    def __enter__(self) -> FakeNvml:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        pass

    def utilisation(self, physical_index: int) -> GpuUtilisation:
        self.asked.append(physical_index)
        if not self.readings[physical_index]:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return self.readings[physical_index].pop(0)
