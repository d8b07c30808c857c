"""The human-readable end-of-run summary: throughput, per-stage latency, busy runners.

It reads the same timings table that goes to the job log, and names the
stages as every other view does (rnb.analysis.stages); the busy fractions and
the bottleneck are `analyze.py`'s own lines over the log just written, so
what is printed and what is logged or analysed later cannot disagree.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rnb.analysis.jobs import read_job
from rnb.analysis.report import format_utilisation
from rnb.analysis.stages import END_TO_END, PARTS, part_key, part_latencies
from rnb.analysis.utilisation import utilisation_columns


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
    latencies = part_latencies(measured, num_steps)
    rows = [(f"step {k} {part.name}", latencies[part_key(part, k)]) for k in range(num_steps) for part in PARTS]
    for stage, seconds in [*rows, (END_TO_END.name, latencies[END_TO_END.key])]:
        ms = seconds[~np.isnan(seconds)] * 1000
        if ms.size:
            lines.append(f"  {stage:<22}{ms.mean():>10.2f}{np.percentile(ms, 50):>10.2f}{np.percentile(ms, 99):>10.2f}")
    return "\n".join(lines)


def utilisation_text(job_dir: Path) -> str:
    """Each runner's busy fraction and CPU use and the bottleneck step of a logged job; '' when none ran."""
    return format_utilisation(utilisation_columns(read_job(job_dir)))
