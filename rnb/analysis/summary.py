"""The human-readable end-of-run summary: throughput and per-stage latency.

It reads the same timings table that goes to the job log, so what is printed
and what is logged cannot disagree.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def stage_latencies(table: pa.Table, num_steps: int) -> dict[str, np.ndarray]:
    """Per-stage latencies in seconds, one value per item, in the job log's derived definitions."""
    col = {name: table.column(name).to_numpy(zero_copy_only=False).astype(float) for name in table.column_names
           if name == "enqueue" or name.startswith(("runner", "inference", "slot"))}
    stages: dict[str, np.ndarray] = {}
    for k in range(num_steps):
        before = col["enqueue"] if k == 0 else col[f"runner{k - 1}_finish"]
        stages[f"step {k} queue wait"] = col[f"runner{k}_start"] - before
        stages[f"step {k} copy"] = (col[f"inference{k}_start"] - col[f"runner{k}_start"]) + (
            col[f"runner{k}_finish"] - col[f"inference{k}_finish"])
        if f"slot{k}_acquired" in col:  # steps that hand over through slots
            # Waiting for a free output slot is back-pressure from the next step, not copying.
            acquired = col[f"slot{k}_acquired"]
            slot_wait = np.where(np.isnan(acquired), 0.0, acquired - col[f"inference{k}_finish"])
            stages[f"step {k} copy"] -= slot_wait
            stages[f"step {k} slot wait"] = slot_wait
        stages[f"step {k} inference"] = col[f"inference{k}_finish"] - col[f"inference{k}_start"]
    stages["end to end"] = col[f"runner{num_steps - 1}_finish"] - col["enqueue"]
    return stages


def summary_text(table: pa.Table, num_steps: int, warmup: int, finished: int, elapsed: float | None,
                 reason: str) -> str:
    lines = [f"termination: {reason}"]
    if elapsed:
        lines.append(f"throughput: {finished / elapsed:.2f} items/s ({finished} items in {elapsed:.3f} s)")
    measured = table.filter(pc.invert(table.column("is_warmup")))
    if measured.num_rows == 0:
        lines.append(f"latency: no items after the first {warmup} (warmup) to report")
        return "\n".join(lines)
    lines.append(f"latency in ms over {measured.num_rows} items (the first {warmup} items are warmup, excluded):")
    lines.append(f"  {'stage':<22}{'mean':>10}{'p50':>10}{'p99':>10}")
    for stage, seconds in stage_latencies(measured, num_steps).items():
        ms = seconds[~np.isnan(seconds)] * 1000
        if ms.size:
            lines.append(f"  {stage:<22}{ms.mean():>10.2f}{np.percentile(ms, 50):>10.2f}{np.percentile(ms, 99):>10.2f}")
    return "\n".join(lines)
