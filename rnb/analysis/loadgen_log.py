"""LoadGen's own result for a job it drove (`--client loadgen`), read from the detail log it wrote into the job.

LoadGen writes `mlperf_log_summary.txt` for people and `mlperf_log_detail.txt`
for machines: one `:::MLLOG {json}` line per key.  The rules it judged the
run by, its verdict and the figures its summary leads with are read from the
latter, and put in the jobs table beside RnB's own judgement by the same
rules (rnb.analysis.loadgen_rules), named and worded the same way.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from rnb.analysis.loadgen_rules import EARLY_STOPPING, MIN_DURATION, MIN_QUERIES, PERFORMANCE, Rule
from rnb.core.records import Json

SUMMARY_FILE, DETAIL_FILE = "mlperf_log_summary.txt", "mlperf_log_detail.txt"
_PREFIX = ":::MLLOG "
# LoadGen's keys for its rules, in its summary's order (the performance constraints are Server's only).
_RULE_KEYS = ((PERFORMANCE, "result_perf_constraints_met"), (MIN_DURATION, "result_min_duration_met"),
              (MIN_QUERIES, "result_min_queries_met"), (EARLY_STOPPING, "early_stopping_met"))
_MORE = re.compile(r"Would need to run at least (\d+) more queries")
_AT_LEAST = re.compile(r"Need to process at least (\d+) queries")


def read_detail(job_dir: Path) -> dict[str, Json] | None:
    """Every key of LoadGen's detail log in the job directory, by name; None where LoadGen wrote none."""
    path = job_dir / DETAIL_FILE
    if not path.is_file():
        return None
    found: dict[str, Json] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(_PREFIX):
            try:
                entry = json.loads(line[len(_PREFIX):])
            except json.JSONDecodeError:
                continue   # a line LoadGen was still writing when its process was killed
            found[str(entry.get("key"))] = entry.get("value")
    return found


def loadgen_log_columns(job_dir: Path) -> dict[str, Json]:
    """LoadGen's verdict, rules, figures and sample count for the jobs table; nulls for a job LoadGen did not drive."""
    detail = read_detail(job_dir)
    if detail is None or "result_validity" not in detail:
        return dict.fromkeys(("loadgen_log_validity", "loadgen_log_rules", "loadgen_log_result", "loadgen_log_samples"))
    rules = [Rule(name, bool(detail[key]), _why(name, detail)) for name, key in _RULE_KEYS if key in detail]
    return {"loadgen_log_validity": str(detail["result_validity"]),
            "loadgen_log_rules": "; ".join(str(rule) for rule in rules),
            "loadgen_log_result": json.dumps(figures(detail)),
            "loadgen_log_samples": samples(detail)}


def samples(detail: dict[str, Json]) -> int | None:
    """The samples LoadGen issued: its queries times the samples in each."""
    queries, size = detail.get("result_query_count"), detail.get("effective_samples_per_query")
    return queries * size if isinstance(queries, int) and isinstance(size, int) else None


def figures(detail: dict[str, Json]) -> dict[str, float]:
    """The figures LoadGen's summary leads with, by the names rnb.analysis.loadgen_rules.result_figures gives them."""
    scenario = detail.get("effective_scenario")
    percentile = detail.get("effective_target_latency_percentile")
    found: dict[str, float] = {}
    if scenario == "Offline":
        _put(found, "samples per second", detail.get("result_samples_per_second"))
        return found
    if scenario == "Server":
        _put(found, "completed samples per second", detail.get("result_completed_samples_per_sec"))
    if isinstance(percentile, (int, float)):
        nth = f"{percentile * 100:g}th"
        per_query = "_per_query" if scenario == "MultiStream" else ""
        latency = detail.get(f"result_{percentile * 100:.2f}_percentile{per_query}_latency_ns")
        _put(found, f"{nth} percentile latency ms", _ms(latency))
        estimate = detail.get("early_stopping_latency_ss" if scenario == "SingleStream" else "early_stopping_latency_ms")
        if scenario != "Server" and isinstance(estimate, (int, float)) and estimate > 0:
            _put(found, f"early stopping {nth} percentile estimate ms", _ms(estimate))
    return found


def _why(rule: str, detail: dict[str, Json]) -> str:
    """Early stopping's shortfall in RnB's words (`59 more queries needed`); LoadGen words the others as advice."""
    if rule != EARLY_STOPPING or detail.get("early_stopping_met"):
        return ""
    text = str(detail.get("early_stopping_result") or "")
    more, least = _MORE.search(text), _AT_LEAST.search(text)
    queries = detail.get("result_query_count")
    if more:
        return f"{more.group(1)} more queries needed"
    if least and isinstance(queries, int):
        return f"{int(least.group(1)) - queries} more queries needed"
    return ""


def _ms(nanoseconds: Json) -> float | None:
    return nanoseconds / 1e6 if isinstance(nanoseconds, (int, float)) else None


def _put(found: dict[str, float], name: str, value: Json) -> None:
    if isinstance(value, (int, float)):
        found[name] = float(value)
