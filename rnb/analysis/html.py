"""One self-contained HTML page: a job's stage table, percentiles, utilisation and plots (analyze.py --html).

The page fetches nothing: plotly.js is inlined once in its head, the style
is inline, and a Content-Security-Policy forbids every fetch, so it opens
the same from a mail attachment, a CI artefact or a machine without a
network.  Other tools (the tuner's report) compose their own pages from
`page`, `table`, `figure` and `job_section`.
"""
from __future__ import annotations

import functools
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rnb.analysis.jobs import ValidityRules, load_jobs, stat_column
from rnb.analysis.report import (
    MAX_LINEAR_SPREAD,
    STAGE_HEADER,
    TableRow,
    device_spread,
    format_percentiles,
    stage_rows,
    utilisation_lines,
    verdict_lines,
)
from rnb.analysis.streams import STREAM_HEADER, stream_rows, stream_totals
from rnb.core.stages import PARTS, part_key

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Inline scripts and styles only; data: and blob: images are what plotly's own toolbar draws with.
POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
          "img-src data: blob:; font-src data:")
DEFAULT_RULES = ValidityRules()
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tr.best td { background: #eaf6ea; font-weight: 600; }
p.note { color: #555; font-size: 0.9em; } p.bounds { font-weight: 600; }
"""


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs
    return get_plotlyjs()


def page(title: str, body: Sequence[str]) -> str:
    """A whole HTML document around `body` (HTML fragments), with plotly.js and the style inline."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
        f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>",
        f"<script>{_plotly_js()}</script>", "</head><body>", f"<h1>{html.escape(title)}</h1>",
        *body, "</body></html>", ""])


def table(header: Sequence[str], rows: Sequence[Sequence[object]], highlight: int | None = None) -> str:
    """An HTML table of text cells (escaped); row `highlight` (0-based) is marked as the best."""
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = []
    for index, row in enumerate(rows):
        cells = "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row)
        marked = ' class="best"' if index == highlight else ""
        body.append(f"<tr{marked}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(fig: go.Figure, div_id: str) -> str:
    """A plotly figure as a <div> and the script that draws it (plotly.js itself is in the page's head)."""
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True}))


def paragraph(text: str, kind: str = "") -> str:
    marked = f' class="{kind}"' if kind else ""
    return f"<p{marked}>{html.escape(text)}</p>"


def step_names(job: TableRow) -> list[str]:
    """Each step with its model's class name, "step 0 (SyntheticFrames)"; "step k" where the log names none."""
    models = json.loads(job.get("step_models") or "[]")
    return [f"step {k} ({models[k].rpartition('.')[2]})" if k < len(models) and isinstance(models[k], str)
            else f"step {k}" for k in range(job["num_steps"])]


def stage_figure(job: TableRow, div_id: str) -> str:
    """Mean time of each part of each step, stacked: they add up to the mean end-to-end latency.

    Where the parts span more than MAX_LINEAR_SPREAD (a sub-millisecond copy
    beside an 800 ms network), they stand side by side on a log axis
    instead, so each one shows.
    """
    import plotly.graph_objects as go

    steps = step_names(job)
    means = {part.name: [job.get(stat_column(part_key(part, k), "mean")) or 0.0 for k in range(job["num_steps"])]
             for part in PARTS}
    shown = [value for values in means.values() for value in values if value > 0]
    spread = bool(shown) and max(shown) > MAX_LINEAR_SPREAD * min(shown)
    fig = go.Figure()
    for name, values in means.items():
        fig.add_bar(name=name, x=values, y=steps, orientation="h")
    title = ("mean latency by step and stage (ms, log scale, side by side)" if spread
             else "mean latency by step and stage (ms)")
    fig.update_layout(barmode="group" if spread else "stack", title=title,
                      height=120 + (40 + 40 * spread) * job["num_steps"], xaxis_title="ms",
                      xaxis_type="log" if spread else "linear", margin={"l": 160, "r": 20, "t": 40, "b": 40},
                      yaxis={"autorange": "reversed"})
    return figure(fig, div_id)


def throughput_figure(job: TableRow, div_id: str) -> str:
    """Items per second over the job's windows, its steady stretch shaded."""
    import plotly.graph_objects as go

    rates = json.loads(job.get("throughput_windows") or "[]")
    width = job.get("throughput_window_s") or 0.0
    fig = go.Figure(go.Scatter(x=[i * width for i in range(len(rates) + 1)], y=rates + rates[-1:],
                               line={"shape": "hv"}, name="items/s"))
    if job.get("steady_start_s") is not None:
        fig.add_vrect(x0=job["steady_start_s"], x1=job["steady_end_s"], fillcolor="green", opacity=0.15,
                      line_width=0, annotation_text="steady state")
    fig.update_layout(title="throughput over time", xaxis_title="s after start", yaxis_title="items/s", height=280,
                      margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return figure(fig, div_id)


def job_section(job: TableRow, heading: str, anchor: str) -> list[str]:
    """One job row as HTML fragments: its summary, percentiles, stage table, utilisation and two plots."""
    def cell(column: str, digits: str = ".4g") -> str:
        value = job.get(column)
        return "-" if value is None else format(value, digits)

    summary = (f"{job['termination_reason']}, {job['validity']}; "
               f"{cell('measured_throughput_items_per_s')} items/s over {cell('measured_duration_s', '.3g')} s "
               f"({job['measured_items']} measured items); end to end p50 {cell(stat_column('e2e', 'p50'))} ms, "
               f"p99 {cell(stat_column('e2e', 'p99'))} ms")
    parts = [f'<h3 id="{html.escape(anchor)}">{html.escape(heading)}</h3>', paragraph(summary)]
    parts.extend(paragraph(line, "note") for line in verdict_lines(job))
    parts.append(paragraph(format_percentiles(job), "note"))
    names = dict(zip((f"step {k}" for k in range(job["num_steps"])), step_names(job)))
    parts.append(table(STAGE_HEADER, [[names.get(row[0], row[0]), *row[1:]] for row in stage_rows(job)]))
    spread = device_spread(job)
    if spread:
        parts.append(paragraph(f"items per device: {spread}", "note"))
    if job.get("streams_record"):
        streams = json.loads(job["streams_record"])
        parts.extend([paragraph(stream_totals(streams)), table(STREAM_HEADER, stream_rows(streams))])
    parts.extend(paragraph(line) for line in utilisation_lines(job))
    parts.append(stage_figure(job, f"{anchor}-stages"))
    if job.get("throughput_windows"):
        parts.append(throughput_figure(job, f"{anchor}-throughput"))
    return parts


def write_job_page(job_dir: str | Path, path: str | Path, rules: ValidityRules = DEFAULT_RULES) -> None:
    """analyze.py JOB --html FILE: one job's page."""
    job = load_jobs([job_dir], rules=rules).jobs.to_pylist()[0]
    # The title names the job: the section's heading and summary need not again.
    Path(path).write_text(page(f"RnB job {job['job_id']}", job_section(job, "summary", "job")), encoding="utf-8")
