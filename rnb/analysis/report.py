"""Human-facing views of the jobs table: terminal tables, a two-job comparison, plots.

Everything here reads the table that `rnb.analysis.load_jobs` returns, so a
script that loads the table itself sees exactly the numbers a person sees.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from rnb.analysis.jobs import STAGE_PARTS, stat_column

SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("job", "job_id"),
    ("reason", "termination_reason"),
    ("validity", "validity"),
    ("items", "measured_items"),
    ("window s", "measured_duration_s"),
    ("items/s", "measured_throughput_items_per_s"),
    ("p50 ms", stat_column("e2e", "p50")),
    ("p99 ms", stat_column("e2e", "p99")),
    ("p99.9 ms", stat_column("e2e", "p99_9")),
    ("max ms", stat_column("e2e", "max")),
    ("peak RSS MiB", "max_peak_rss_bytes"),
    ("peak dev MiB", "max_peak_device_bytes"),
)
STAGE_STATS: tuple[str, ...] = ("mean", "p50", "p99", "max")
COMPARE_FIELDS: tuple[str, ...] = (
    "mean_interval_ms", "videos", "batch_size", "measured_items", "measured_duration_s",
    "throughput_items_per_s", "measured_throughput_items_per_s",
    *(stat_column("e2e", s) for s in ("min", "mean", "p50", "p90", "p95", "p99", "p99_9", "max")),
    "bytes_fetched_per_s", "frames_decoded_per_s", "max_peak_rss_bytes", "max_peak_device_bytes",
)


def _cell(value: Any, column: str = "") -> str:
    if value is None:
        return "-"
    if column.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(jobs: pa.Table) -> str:
    """One line per job: the numbers a reader looks at first, then why any job is INVALID."""
    records = jobs.to_pylist()
    rows = [[_cell(r.get(column), column) for _, column in SUMMARY_COLUMNS] for r in records]
    text = _grid([title for title, _ in SUMMARY_COLUMNS], rows)
    reasons = [f"  {r['job_id']}: INVALID: {r['invalid_because']}" for r in records if r["invalid_because"]]
    errors = [f"  {r['job_id']}: {r['failed_process']} failed: {r['error']}" for r in records if r.get("error")]
    return "\n".join([text, *reasons, *errors])


def format_stages(job: dict[str, Any]) -> str:
    """Per-stage breakdown of one job row: queue wait, copy and inside time of each step."""
    rows = []
    for k in range(job["num_steps"]):
        for part in STAGE_PARTS:
            prefix = f"{part}{k}"
            rows.append([f"step {k}", part, *(_cell(job.get(stat_column(prefix, s))) for s in STAGE_STATS)])
    rows.append(["all", "end to end", *(_cell(job.get(stat_column("e2e", s))) for s in STAGE_STATS)])
    devices = json.loads(job.get("items_per_device") or "{}")
    spread = "; ".join(f"step {k}: " + ", ".join(f"{d} {n}" for d, n in counts.items()) for k, counts in devices.items())
    header = f"{job['job_id']} (items per device: {spread or '-'})"
    return header + "\n" + _grid(["step", "stage", *(f"{s} ms" for s in STAGE_STATS)], rows)


def format_report(jobs: pa.Table) -> str:
    """The whole terminal report: the summary table, then each job's stages."""
    return "\n\n".join([format_summary(jobs), *(format_stages(job) for job in jobs.to_pylist())])


def format_compare(job_a: dict[str, Any], job_b: dict[str, Any]) -> str:
    """Two job rows side by side; the ratio is B / A, so >1 means B is larger."""
    fields = [*COMPARE_FIELDS]
    steps = max(job_a["num_steps"], job_b["num_steps"])
    fields += [stat_column(f"{part}{k}", s) for k in range(steps) for part in STAGE_PARTS for s in ("mean", "p99")]
    rows = [
        ["config_path", str(job_a.get("config_path")), str(job_b.get("config_path")), ""],
        ["termination_reason", job_a["termination_reason"], job_b["termination_reason"], ""],
        ["validity", job_a["validity"], job_b["validity"], ""],
    ]
    for field in fields:
        a, b = job_a.get(field), job_b.get(field)
        ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
        rows.append([field, _cell(a), _cell(b), ratio])
    return _grid(["metric", f"A {job_a['job_id']}", f"B {job_b['job_id']}", "B/A"], rows)


def load_curves(jobs: pa.Table) -> dict[str, list[tuple[float, float, float]]]:
    """For each config run at two or more loads: (mean interval, throughput, p99 ms), lightest load first.

    Bulk runs (-mi 0) are the heaviest load there is, so they come last.
    """
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for job in jobs.to_pylist():
        throughput, p99 = job["measured_throughput_items_per_s"], job[stat_column("e2e", "p99")]
        if throughput is None or p99 is None:
            continue
        curves.setdefault(str(job["config_path"]), []).append((job["mean_interval_ms"], throughput, p99))
    return {
        config: sorted(points, key=lambda point: -point[0] if point[0] else math.inf)
        for config, points in curves.items()
        if len({point[0] for point in points}) >= 2
    }


def plot_jobs(jobs: pa.Table, path: str | Path) -> None:
    """Stacked mean latency per stage for each job; beside it, throughput against p99 per config.

    Mean stage times stack to the mean end-to-end latency exactly (the stages
    partition each item's time), which is why the bars use means.
    """
    import matplotlib  # here, not at the top: only plotting pays for the slow import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = jobs.to_pylist()
    curves = load_curves(jobs)
    figure, axes = plt.subplots(1, 2 if curves else 1, figsize=(13 if curves else 8, 5), squeeze=False)
    bars = axes[0][0]
    steps = max(r["num_steps"] for r in records)
    positions = range(len(records))
    bottoms = [0.0] * len(records)
    colors = matplotlib.colormaps["tab20"]
    for k in range(steps):
        for p, part in enumerate(STAGE_PARTS):
            heights = [r.get(stat_column(f"{part}{k}", "mean")) or 0.0 for r in records]
            bars.bar(positions, heights, bottom=bottoms, label=f"step {k} {part}", color=colors((3 * k + p) % 20))
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    bars.set_ylabel("mean latency (ms)")
    bars.set_title("end-to-end latency by stage")
    bars.set_xticks(positions, [r["job_id"] for r in records], rotation=30, ha="right", fontsize=7)
    bars.legend(fontsize=7)
    if curves:
        load = axes[0][1]
        for config, points in curves.items():
            load.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=Path(config).name)
            for interval, throughput, p99 in points:
                load.annotate(f"mi {interval:g}", (throughput, p99), fontsize=7)
        load.set_xlabel("throughput (items/s)")
        load.set_ylabel("p99 end-to-end latency (ms)")
        load.set_title("throughput against p99 latency")
        load.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
