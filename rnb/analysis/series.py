"""What a job did over its run, as the plots draw it: latency, offered and served rates, missed frames, CPU, memory.

analyze.py's --plot (rnb.analysis.plots) and the job page
(rnb.analysis.figures) draw the same figures from these series, so the
two cannot disagree.  Every time is in seconds after the job's start.
A rate is counted over windows of at least one sampling interval: a CPU
percentage over the 0.35 ms between the last two samples of a process
reads its 10 ms clock tick as 2,900%.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rnb.analysis.stats import window_count
from rnb.core.joblog import SAMPLES_FILE, TIMINGS_FILE
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.load import FATES, LATE_FIELD, OFFERED_FILE, STREAM_FIELD, logged_settings, mode_of, parse_schedule

ROLLING_POINTS = 200   # where the rolling percentile is evaluated: enough for a smooth line, few for a page
CPU_SPAN_S = 0.5       # the shortest span a CPU percentage is taken over, on a run long enough for 10 of them


@dataclass(frozen=True)
class Line:
    """One line of a plot: its name and its points."""

    name: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class Rates:
    """Requests offered and items served per second over the job's windows, and the load's own rate where it has one
    (a Poisson rate, streams times fps, a schedule's spans)."""

    window_s: float
    starts: tuple[float, ...]
    offered: tuple[float, ...]
    served: tuple[float, ...]
    scheduled: Line | None


@dataclass(frozen=True)
class Missed:
    """Each stream's frames missed (late, or dropped) over the job's windows, as a percentage of those it offered in
    the window (NaN where it offered none)."""

    window_s: float
    starts: tuple[float, ...]
    percent: tuple[tuple[float, ...], ...]   # [stream][window]


class JobSeries:
    """One job's log read for its plots: items, offered requests and samples, on the job's clock."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.row = row
        self.job_dir = Path(str(row["job_dir"]))
        self.start = float(row.get("start_time") or 0.0)
        self.end = float(row.get("end_time") or self.start)
        final = StepEvents(int(row["num_steps"]) - 1).handed_over
        file = pq.ParquetFile(self.job_dir / TIMINGS_FILE)
        names = [name for name in ("item_id", ENQUEUE, final, STREAM_FIELD, LATE_FIELD, "due")
                 if name in file.schema_arrow.names]
        self.items = file.read(columns=names)
        self.enqueued = self._seconds(self.items, ENQUEUE)
        self.finished = self._seconds(self.items, final)
        offered = self.job_dir / OFFERED_FILE
        self.offered = pq.read_table(offered) if offered.is_file() else None
        samples = self.job_dir / SAMPLES_FILE
        self.samples = pq.read_table(samples) if samples.is_file() else None

    def _seconds(self, table: pa.Table, name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False).astype(float) - self.start

    @property
    def span_s(self) -> float:
        return max(self.end - self.start, 1e-9)

    def windows(self) -> np.ndarray:
        """The rate windows' edges over the run: about a hundred items each (3 to 20 windows), none shorter than one
        sampling interval."""
        count = window_count(int(np.count_nonzero(~np.isnan(self.finished))))
        interval = self.sample_interval_s()
        if interval > 0:
            count = max(1, min(count, int(self.span_s / interval)))
        return np.linspace(0.0, self.span_s, count + 1)

    def window_s(self) -> float:
        edges = self.windows()
        return float(edges[1] - edges[0])

    def sample_interval_s(self) -> float:
        """The sampler's interval, as its samples show it (the median gap of a process's samples); 0 without samples."""
        if self.samples is None or self.samples.num_rows < 2:
            return 0.0
        rows = self.samples.filter(pc.is_valid(self.samples.column("process")))
        gaps = [np.diff(np.sort(times)) for times in _by_name(rows, "time").values() if len(times) > 1]
        joined = np.concatenate(gaps) if gaps else np.array([])
        return float(np.median(joined)) if joined.size else 0.0

    def latency(self) -> tuple[np.ndarray, np.ndarray]:
        """Each finished item's enqueue time and end-to-end latency in ms, in enqueue order."""
        order = np.argsort(self.enqueued, kind="stable")
        return self.enqueued[order], (self.finished - self.enqueued)[order] * 1000.0

    def rolling_p99(self, window_s: float) -> Line:
        """The p99 of the latencies of the items sent in the last `window_s` seconds, at ROLLING_POINTS times."""
        x, y = self.latency()
        if x.size == 0:
            return Line(f"rolling p99 over {window_s:.3g} s", (), ())
        times = np.linspace(x[0] + min(window_s, x[-1] - x[0]), x[-1], ROLLING_POINTS) if x[-1] > x[0] else x[:1]
        lows, highs = np.searchsorted(x, times - window_s, side="right"), np.searchsorted(x, times, side="right")
        points = [(float(t), float(np.percentile(y[low:high], 99))) for t, low, high in zip(times, lows, highs)
                  if high > low]
        return Line(f"rolling p99 over {window_s:.3g} s", tuple(t for t, _ in points), tuple(v for _, v in points))

    def rates(self) -> Rates:
        """Offered and served requests per second over the windows, and the load's own rate."""
        edges = self.windows()
        width = float(edges[1] - edges[0])
        offered_at = self.offered_times()
        offered, _ = np.histogram(offered_at[~np.isnan(offered_at)], bins=edges)
        served, _ = np.histogram(self.finished[~np.isnan(self.finished)], bins=edges)
        return Rates(width, tuple(edges[:-1].tolist()), tuple((offered / width).tolist()),
                     tuple((served / width).tolist()), self.scheduled())

    def offered_times(self) -> np.ndarray:
        """When each request was offered: its due time in the offered log, else (older logs, loads without due
        times) its enqueue time, which leaves out the dropped."""
        if self.offered is not None and self.offered.column("due").null_count == 0 and self.offered.num_rows:
            return self._seconds(self.offered, "due")
        return self.enqueued

    def scheduled(self) -> Line | None:
        """The rate the load asked for over the run: a Poisson rate, streams times fps, or a schedule's spans
        repeated; None for a load without one (bulk, the closed loop, a trace, whose offered rate is its own)."""
        settings = logged_settings(self.row)
        mode = mode_of(settings).name
        ends = (0.0, self.span_s)
        if mode == "poisson":
            return Line("Poisson rate", ends, (1000.0 / settings.mean_interval_ms,) * 2)
        if mode == "streams":
            count = settings.streams or 0
            return Line(f"{count} stream{'' if count == 1 else 's'} x {settings.fps:g} fps", ends, (count * settings.fps,) * 2)
        if mode != "schedule":
            return None
        spans, x, y, begin = parse_schedule(settings.rate_schedule or ""), [], [], 0.0
        while begin < self.span_s:
            for span in spans:
                x += [begin, begin + span.seconds]
                y += [span.start, span.end]
                begin += span.seconds
        return Line(f"schedule {settings.rate_schedule}", tuple(x), tuple(y))

    def missed(self) -> Missed | None:
        """Each stream's missed frames over the windows; None for a job without streams."""
        count = self.row.get("stream_count") or 0
        if not count or STREAM_FIELD not in self.items.column_names:
            return None
        edges = self.windows()
        width = float(edges[1] - edges[0])
        streams, due, missed = self._frames()
        percent = []
        for stream in range(int(count)):
            mine = streams == stream
            offered, _ = np.histogram(due[mine], bins=edges)
            late, _ = np.histogram(due[mine & missed], bins=edges)
            with np.errstate(invalid="ignore", divide="ignore"):
                percent.append(tuple(np.where(offered > 0, 100.0 * late / np.maximum(offered, 1), math.nan).tolist()))
        return Missed(width, tuple(edges[:-1].tolist()), tuple(percent))

    def _frames(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every frame offered: its stream, due time and whether it was missed (late, or dropped under the drop
        policy); from the offered log where there is one, else the finished frames only."""
        if LATE_FIELD in self.items.column_names:
            late = self.items.column(LATE_FIELD).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        else:
            late = np.zeros(self.items.num_rows, dtype=bool)
        when = self._seconds(self.items, "due") if "due" in self.items.column_names else self.enqueued
        streams = self.items.column(STREAM_FIELD).to_numpy(zero_copy_only=False)
        if self.offered is None or self.offered.column("due").null_count:
            return streams.astype(float), when, late
        late_ids = {item for item, flag in zip(self.items.column("item_id").to_pylist(), late) if flag}
        fates = self.offered.column("fate").to_pylist()
        missed = np.array([fate == FATES[1] or item in late_ids
                           for item, fate in zip(self.offered.column("item_id").to_pylist(), fates)], dtype=bool)
        return (self.offered.column("stream").to_numpy(zero_copy_only=False).astype(float),
                self._seconds(self.offered, "due"), missed)

    def cpu_and_memory(self) -> tuple[list[Line], list[Line]]:
        """Each process's CPU use (percent of one core) between samples at least one sampling interval apart, and its
        resident memory (MiB) while it ran: a process that has exited (its last sample reads no memory) is not drawn
        at 0.  Then each GPU's utilisation and memory, where the job used one."""
        if self.samples is None:
            return [], []
        # A process's CPU clock moves in ticks of 10 ms: over less than half a second a tick is more than 2%.
        interval = max(self.sample_interval_s(), min(CPU_SPAN_S, self.span_s / 10))
        rows = [row for row in self.samples.to_pylist() if self.start <= row["time"] <= self.end]
        cpu: list[Line] = []
        memory: list[Line] = []
        for name, mine in _grouped(rows).items():
            if mine[0]["process"] is None:   # a GPU's rows
                times = tuple(row["time"] - self.start for row in mine)
                cpu.append(Line(f"{name} util %", times, tuple(float(row["gpu_util_percent"] or 0) for row in mine)))
                memory.append(Line(name, times, tuple((row["gpu_memory_used_bytes"] or 0) / 2**20 for row in mine)))
                continue
            alive = [row for row in mine if row["rss_bytes"]]
            memory.append(Line(name, tuple(row["time"] - self.start for row in alive),
                               tuple(row["rss_bytes"] / 2**20 for row in alive)))
            cpu.append(_cpu_line(name, alive, interval, self.start))
        return cpu, memory


def _cpu_line(name: str, rows: Sequence[Mapping[str, Any]], interval: float, start: float) -> Line:
    """CPU % between samples at least 0.9 of `interval` apart, drawn at the later one."""
    kept = list(rows[:1])
    for row in rows[1:]:
        if row["time"] - kept[-1]["time"] >= 0.9 * interval:
            kept.append(row)
    pairs = list(zip(kept, kept[1:]))
    return Line(name, tuple(b["time"] - start for _, b in pairs),
                tuple(100.0 * (b["cpu_s"] - a["cpu_s"]) / (b["time"] - a["time"]) for a, b in pairs))


def _grouped(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Sample rows by process name, or `gpu N` for a GPU's."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["process"] or f"gpu {row['gpu']}", []).append(row)
    return grouped


def _by_name(samples: pa.Table, column: str) -> dict[str, np.ndarray]:
    names = samples.column("process").to_pylist()
    values = samples.column(column).to_numpy(zero_copy_only=False)
    grouped: dict[str, list[float]] = {}
    for name, value in zip(names, values):
        grouped.setdefault(name, []).append(value)
    return {name: np.array(series) for name, series in grouped.items()}
