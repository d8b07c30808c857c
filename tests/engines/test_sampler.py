"""The utilisation sampler: real processes through psutil, GPUs through a fake at the NVML seam."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq

from rnb.engines.sampler import SCHEMA, SampledGpu, Sampler
from rnb.pipeline.gpus import GpuUtilisation, Nvml
from tests.support.fake_nvml import FakeNvml


def test_one_sample_reads_each_process_and_each_gpu(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        nvml = FakeNvml({3: [GpuUtilisation(41, 5 * 2**30, 7, 251.5), GpuUtilisation(42, 6 * 2**30, 8)]})
        clock = iter([100.0, 100.01, 100.02, 100.1, 100.11, 100.2])   # each row's read, in order
        sampler = Sampler(0.1, (SampledGpu(logical_index=0, physical_index=3),), nvml, lambda: next(clock))
        sampler.watch("main", os.getpid())
        sampler.watch("child", child.pid)
        sampler.sample(nvml)
        child.kill()
        child.wait()
        sampler.sample(nvml)
        sampler.sample(nvml)   # NVML fails now: the GPU drops out of sampling, the job goes on
    finally:
        child.kill()
    assert nvml.asked == [3, 3, 3] and sampler.gpus == ()
    rows = [{key: value for key, value in row.items() if value is not None} for row in sampler.table().to_pylist()]
    assert [(row["time"], row.get("process"), row.get("gpu")) for row in rows] == [
        (100.0, "main", None), (100.01, "child", None), (100.02, None, 0), (100.1, "main", None), (100.11, None, 0),
        (100.2, "main", None)]
    assert rows[2] == {"time": 100.02, "gpu": 0, "gpu_util_percent": 41, "gpu_memory_used_bytes": 5 * 2**30,
                       "nvdec_util_percent": 7, "power_watts": 251.5}
    # A board without a power sensor: its power is null, the rest is sampled.
    assert rows[4]["gpu_util_percent"] == 42 and rows[4]["nvdec_util_percent"] == 8 and "power_watts" not in rows[4]
    assert rows[1]["pid"] == child.pid and rows[0]["pid"] == os.getpid()
    assert 0 < rows[0]["rss_bytes"] and rows[0]["cpu_s"] <= rows[3]["cpu_s"]
    assert 0 <= rows[0]["run_wait_s"] <= rows[3]["run_wait_s"]   # /proc/PID/schedstat, kept by this kernel
    sampler.write(tmp_path)
    assert pq.read_table(tmp_path / "samples.parquet").schema.equals(SCHEMA)


def test_the_thread_samples_until_stopped_without_nvml_when_no_gpu_is_used() -> None:
    def no_nvml() -> None:
        raise AssertionError("a CPU-only job must not open NVML")

    sampler = Sampler(0.01, (), no_nvml)
    sampler.watch("main", os.getpid())
    sampler.watch("gone", 2**22 + 12345)   # no such pid: skipped, not an error
    sampler.start()
    deadline = time.time() + 60
    while len(sampler.rows) < 3 and time.time() < deadline:
        time.sleep(0.01)
    sampler.stop()
    count = len(sampler.rows)
    time.sleep(0.05)
    assert count == len(sampler.rows) >= 3
    times = [row["time"] for row in sampler.rows]
    assert times == sorted(times) and {row["process"] for row in sampler.rows} == {"main"}
    assert all(row["rss_bytes"] > 0 and row["pid"] == os.getpid() for row in sampler.rows)


class _Py3nvmlUtilisation:
    """py3nvml's answers to the utilisation calls, in its units (milliwatts for power), without loading it."""

    def __init__(self, milliwatts: int | None) -> None:
        self.milliwatts = milliwatts

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=63)

    def nvmlDeviceGetDecoderUtilization(self, handle: int) -> tuple[int, int]:
        return 12, 167000

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=3 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if self.milliwatts is None:
            raise RuntimeError("Not Supported")
        return self.milliwatts


def test_nvml_reads_the_board_power_in_watts_and_none_where_it_has_no_sensor() -> None:
    nvml = Nvml()
    nvml._nv = _Py3nvmlUtilisation(187_250)
    assert nvml.utilisation(0) == GpuUtilisation(63, 3 * 2**30, 12, 187.25)
    nvml._nv = _Py3nvmlUtilisation(None)
    assert nvml.utilisation(0) == GpuUtilisation(63, 3 * 2**30, 12, None)
