"""One self-contained HTML page: a job's stage table, percentiles, utilisation and plots (analyze.py --html).

The page fetches nothing: plotly.js is inlined once in its head, the style
is inline, and a Content-Security-Policy forbids every fetch, so it opens
the same from a mail attachment, a CI artefact or a machine without a
network.  Other tools (the tuner's report) compose their own pages from
`page`, `table`, rnb.analysis.figures.figure and `job_section`.
"""
from __future__ import annotations

import functools
import html
import json
from collections.abc import Sequence
from pathlib import Path

from rnb.analysis.figures import latency_figure, missed_figure, processes_figure, rates_figure, stage_figure
from rnb.analysis.job_columns import stat_column
from rnb.analysis.jobs import ValidityRules, load_jobs
from rnb.analysis.loads import SPAN_HEADER, load_words, span_rows
from rnb.analysis.report import (
    STAGE_HEADER,
    TableRow,
    device_spread,
    format_percentiles,
    stage_rows,
    utilisation_lines,
    verdict_lines,
)
from rnb.analysis.series import JobSeries
from rnb.analysis.streams import STREAM_HEADER, stream_rows, stream_totals

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


def paragraph(text: str, kind: str = "") -> str:
    marked = f' class="{kind}"' if kind else ""
    return f"<p{marked}>{html.escape(text)}</p>"


def step_names(job: TableRow) -> list[str]:
    """Each step with its model's class name, "step 0 (SyntheticFrames)"; "step k" where the log names none."""
    models = json.loads(job.get("step_models") or "[]")
    return [f"step {k} ({models[k].rpartition('.')[2]})" if k < len(models) and isinstance(models[k], str)
            else f"step {k}" for k in range(job["num_steps"])]


def job_section(job: TableRow, heading: str, anchor: str) -> list[str]:
    """One job row as HTML fragments: its summary, percentiles, stage table, utilisation and two plots."""
    def cell(column: str, digits: str = ".4g") -> str:
        value = job.get(column)
        return "-" if value is None else format(value, digits)

    summary = (f"load {load_words(job)}; {job['termination_reason']}, {job['validity']}; "
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
    if job.get("schedule_spans"):
        parts.append(table(SPAN_HEADER, span_rows(json.loads(job["schedule_spans"]))))
    parts.extend(paragraph(line) for line in utilisation_lines(job))
    parts.append(stage_figure(job, f"{anchor}-stages", step_names(job)))
    if job.get("start_time") is not None and job.get("end_time") is not None:
        series = JobSeries(job)
        parts.extend(filter(None, (rates_figure(series, job, f"{anchor}-rates"), latency_figure(series, f"{anchor}-latency"),
                                   missed_figure(series, f"{anchor}-missed"),
                                   processes_figure(series, f"{anchor}-processes"))))
    return parts


def write_job_page(job_dir: str | Path, path: str | Path, rules: ValidityRules = DEFAULT_RULES) -> None:
    """analyze.py JOB --html FILE: one job's page."""
    job = load_jobs([job_dir], rules=rules).jobs.to_pylist()[0]
    # The title names the job: the section's heading and summary need not again.
    Path(path).write_text(page(f"RnB job {job['job_id']}", job_section(job, "summary", "job")), encoding="utf-8")
