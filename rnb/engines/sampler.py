"""Utilisation over time: a thread of the main process samples every child and every GPU in use.

Every `interval_s` it records, for each child process, its cumulative CPU
time, how long its main thread has waited for a core while it could run
(/proc/PID/schedstat: what other work on the cores cost it), and its
resident memory (psutil), and for each GPU the job uses, NVML's
utilisation, memory in use, NVDEC utilisation and board power. The rows become
`samples.parquet` in the job directory; rnb.analysis turns them into CPU
percentages, plots and the summary. Sampling reads /proc and NVML only, so
it costs the children nothing, and a child that has exited is simply no
longer sampled.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from rnb.core.joblog import SAMPLES_FILE
from rnb.pipeline.gpus import GpuUtilisation, Nvml

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 100.0
SCHEMA = pa.schema([
    ("time", pa.float64()),                 # epoch seconds
    ("process", pa.string()),               # a child's name; null on GPU rows
    ("pid", pa.int64()),
    ("cpu_s", pa.float64()),                # user + system CPU seconds since the process started
    ("run_wait_s", pa.float64()),           # seconds its main thread waited runnable for a core; null unknown
    ("rss_bytes", pa.int64()),
    ("gpu", pa.int64()),                    # the config's logical GPU index; null on process rows
    ("gpu_util_percent", pa.int64()),
    ("gpu_memory_used_bytes", pa.int64()),
    ("nvdec_util_percent", pa.int64()),
    ("power_watts", pa.float64()),          # the board's draw; null where NVML does not report it
])


# One row of samples.parquet by column name (SCHEMA), a process's or a GPU's.
SampleRow = dict[str, float | str | None]


class Utilisations(Protocol):
    """What sampling asks of an open NVML session (rnb.pipeline.gpus.Nvml, or a test's fake)."""

    def utilisation(self, physical_index: int) -> GpuUtilisation: ...


@dataclass(frozen=True)
class SampledGpu:
    logical_index: int
    physical_index: int


@dataclass
class Sampler:
    """Samples until stopped; `rows` grows in time order and is read after `stop()`."""

    interval_s: float
    gpus: tuple[SampledGpu, ...] = ()
    nvml: Callable[[], AbstractContextManager[Utilisations]] = Nvml
    clock: Callable[[], float] = time.time
    rows: list[SampleRow] = field(default_factory=list)
    _processes: dict[str, psutil.Process] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def watch(self, name: str, pid: int) -> None:
        """Sample this process from the next tick on; one that is already gone is skipped."""
        try:
            self._processes[name] = psutil.Process(pid)
        except psutil.Error:
            log.debug("not sampling %s (pid %d): it is gone", name, pid)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rnb-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        with ExitStack() as stack:
            session = stack.enter_context(self.nvml()) if self.gpus else None
            next_tick = self.clock()
            while not self._stop.is_set():
                self.sample(session)
                next_tick += self.interval_s
                self._stop.wait(max(0.0, next_tick - self.clock()))

    def sample(self, nvml: Utilisations | None) -> None:
        """One row per live process and per GPU, each stamped when its values were read.

        One stamp for a whole sample, taken before the reads, put a process
        read late (the sampler thread waiting for a core, on a loaded host)
        beside an earlier time: over two samples close together its wait
        for a core read more than the time between them.
        """
        for name, process in list(self._processes.items()):
            try:
                with process.oneshot():
                    times, memory = process.cpu_times(), process.memory_info()
            except psutil.Error:
                del self._processes[name]   # it exited; its last sample stands
                continue
            waited = run_wait_s(process.pid)
            self.rows.append({"time": self.clock(), "process": name, "pid": process.pid,
                              "cpu_s": times.user + times.system, "run_wait_s": waited, "rss_bytes": memory.rss})
        if nvml is None:  # no GPU in use: NVML was never opened
            return
        for gpu in self.gpus:
            try:
                state = nvml.utilisation(gpu.physical_index)
            except Exception as exc:  # NVML reports unsupported queries and lost GPUs through assorted types
                log.warning("GPU %d is no longer sampled: NVML failed (%s)", gpu.logical_index, exc)
                self.gpus = tuple(other for other in self.gpus if other != gpu)
                continue
            self.rows.append({"time": self.clock(), "gpu": gpu.logical_index, "gpu_util_percent": state.gpu_percent,
                              "gpu_memory_used_bytes": state.memory_used_bytes,
                              "nvdec_util_percent": state.decoder_percent, "power_watts": state.power_watts})

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=SCHEMA)

    def write(self, job_dir: Path) -> None:
        pq.write_table(self.table(), job_dir / SAMPLES_FILE)


def run_wait_s(pid: int) -> float | None:
    """Seconds the process's main thread has spent runnable but waiting for a core (None where not kept).

    Only the main thread: reading every thread's would cost the sampler a
    file per thread per tick, and a runner computes on its main thread.
    """
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
