"""Report: best.json, candidates.parquet, the throughput-vs-latency plot (rnb.tune.pareto), report.html.

Every file is written whole or not at all (a temporary name, then a rename),
so a reader never sees half a report, and best.json exists only when a
finalist met the bound as measured.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rnb.analysis.figures import figure
from rnb.analysis.html import job_section, page, paragraph, table
from rnb.analysis.jobs import ValidityRules, load_jobs, rows_to_table
from rnb.analysis.report import TableRow
from rnb.analysis.sweep import format_interval
from rnb.core.records import JsonObject
from rnb.engines.registry import DEFAULT_ENGINE
from rnb.tune.cores import saturated
from rnb.tune.estimate import Estimator
from rnb.tune.pareto import Point, pareto_figure, plot_points, write_plot_png
from rnb.tune.profile import Profile
from rnb.tune.profile_cache import write_json_atomic
from rnb.tune.search import Evaluated, Goal, Search
from rnb.tune.space import Candidate, GroupChoices, TuneSpace
from rnb.tune.verify import Verified, VerifySettings, videos_for

BEST = "best.json"
CANDIDATES = "candidates.parquet"
PLOT = "pareto.png"
REPORT = "report.html"
MAX_TABLE_ROWS = 200   # candidates shown in the page's table; the Parquet file holds them all


@dataclass(frozen=True)
class Request:
    """What was asked, as the report repeats it."""

    config: str
    budget: str
    goal: Goal
    bound_ms: float
    percentile: float
    search: str
    engine: str


@dataclass(frozen=True)
class Outcome:
    """Everything the tuner found: the search, the finalists as measured, the winner (None if none met the bound)."""

    request: Request
    search: Search
    verified: tuple[Verified, ...]
    winner: Verified | None
    profiles: tuple[tuple[str, Profile], ...]   # what was profiled ("step 2 at batch 4") and its profile
    seconds: Mapping[str, float]        # phase -> wall seconds


def winner_of(verified: Sequence[Verified], space: TuneSpace, goal: Goal) -> Verified | None:
    """The finalist that measured best: most items/s under the bound, or the fewest devices meeting the target.

    Predictions play no part here.  A peak is known only to the last step
    of its bisection (`Verified.resolution_per_s`), so a finalist that
    measured less than the best by no more than either one's step is as
    good as measured, and among those the fewest devices win (then the
    higher rate): on a host whose cores are the bound, more CPU replicas
    measure the same within the noise and must not win for it.
    """
    met = [v for v in verified if v.best is not None]
    if goal.objective == "devices" and goal.target_rate is not None:
        serving = [v for v in met if v.rate >= goal.target_rate]
        if serving:
            return min(serving, key=lambda v: (space.devices_used(v.candidate), -v.rate))
    top = max(met, key=lambda v: (v.rate, -space.devices_used(v.candidate)), default=None)
    if top is None:
        return None
    level = [v for v in met if top.rate - v.rate <= max(top.resolution_per_s or 0.0, v.resolution_per_s or 0.0)]
    return min(level, key=lambda v: (space.devices_used(v.candidate), -v.rate))


def resolution_note(winner: Verified) -> str:
    """How well the winner's peak is known, and what that meant for choosing it."""
    step = winner.resolution_per_s
    if step is None:
        return "its peak is known only to be at least that (no rate tried broke the bound)."
    return (f"the verification resolves a peak to its last bisection step, {step:.3g} req/s here: a finalist "
            "measured within that of the best counts as equal to it, and the fewest devices win among equals.")


# ---------------------------------------------------------------- candidates.parquet

def candidate_rows(space: TuneSpace, found: Search, verified: Sequence[Verified],
                   rules: ValidityRules) -> list[JsonObject]:
    """One row per candidate predicted or pruned: its settings, prediction and, where run, what was measured."""
    by_candidate = {v.candidate: v for v in verified}
    ranked = found.ranked()
    rows = []
    for position, evaluated in enumerate(ranked, start=1):
        rows.append(_row(space, evaluated.candidate, position, evaluated, by_candidate.get(evaluated.candidate),
                         found.estimator.percentile, rules))
    for candidate, why in found.pruned.items():
        rows.append({**_row(space, candidate, None, None, None, found.estimator.percentile, rules), "pruned": why})
    return rows


def _row(space: TuneSpace, candidate: Candidate, position: int | None, evaluated: Evaluated | None,
         verified: Verified | None, percentile: float, rules: ValidityRules) -> JsonObject:
    row: JsonObject = {"key": candidate.key, "rank": position, "label": space.label(candidate),
                           "short_label": space.short_label(candidate), "devices_used": space.devices_used(candidate),
                           "cpu_slots_used": space.cpu_slots_used(candidate),
                           "gpus_used": ",".join(str(g) for g in space.gpus_used(candidate))}
    for g in space.groups:
        settings = candidate.group(g.step, g.group)
        if g.kind == "batcher":
            row[f"{g.name} batch"] = settings.batch
        else:
            row[f"{g.name} replicas"] = settings.replicas
            row[f"{g.name} devices"] = ",".join(str(d) for d in settings.devices)
    for k, choices in enumerate(space.segments):
        if len(choices) > 1:
            row[f"step {k} segments"] = candidate.steps[k].segments
    row["pruned"] = None
    q = _stat(percentile)
    if evaluated is not None:
        estimate = evaluated.estimate
        at = estimate.at_peak
        row.update({"predicted_peak_rate_per_s": estimate.rate_per_s, "predicted_capacity_per_s": estimate.capacity_per_s,
                    "predicted_throughput_items_per_s": None if at is None else at.throughput_items_per_s,
                    "predicted_bottleneck": None if at is None else at.bottleneck,
                    "predicted_cores_busy": None if at is None else at.cores_busy})
        for stat in sorted({50.0, 90.0, 99.0, percentile}):
            row[f"predicted_{_stat(stat)}_ms"] = None if at is None else at.latency_ms.get(stat)
        row[f"predicted_{q}_ms_at_lowest_rate"] = estimate.lowest.latency_ms.get(percentile)
    row["verified"] = verified is not None
    if verified is not None:
        best = verified.best
        row.update({"measured_peak_rate_per_s": None if best is None else best.rate_per_s,
                    f"measured_{q}_ms": None if best is None else best.latency_ms,
                    "job_log": None if best is None or best.job_dir is None else str(best.job_dir),
                    "config_path": str(verified.config_path),
                    "verify_trials": json.dumps([{"rate_per_s": t.rate_per_s,
                                                  "latency_ms": None if math.isinf(t.latency_ms) else t.latency_ms,
                                                  "job_dir": None if t.job_dir is None else str(t.job_dir)}
                                                 for t in verified.trials])})
        if best is not None and best.job_dir is not None:
            job = load_jobs([best.job_dir], rules=rules).jobs.to_pylist()[0]
            row["measured_throughput_items_per_s"] = job["measured_throughput_items_per_s"]
            row["measured_p50_ms"] = job["e2e_p50_ms"]
            row["measured_p99_ms"] = job["e2e_p99_ms"]
            row["measured_bottleneck_step"] = job["bottleneck_step"]
    return row


def _stat(percentile: float) -> str:
    return f"p{percentile:g}".replace(".", "_")


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial)
    os.replace(partial, path)


# ---------------------------------------------------------------- what bounds a finalist

def bounding_sentence(space: TuneSpace, estimator: Estimator, verified: Verified, job: TableRow) -> str:
    """One sentence on what bounds a measured finalist, and what one more replica of it would add (predicted).

    The bound is the job's bottleneck as analysis defines it
    (rnb.analysis.utilisation: the busiest step by its own work, a Batcher's
    wait for company left out, when near saturation), and within that step
    its busiest group.  Below saturation the latency bound, not a step's
    capacity, kept the peak rate where it is.
    """
    label = space.short_label(verified.candidate)
    cores = cores_sentence(space, estimator, verified.candidate, job)
    if cores is not None:
        return f"{label}: {cores}"
    if job.get("busiest_step") is None:
        return f"{label}: its job recorded no busy runners, so nothing names a bottleneck."
    busy = json.loads(job.get("busy_fraction") or "{}")
    if job.get("bottleneck_step") is None:
        return (f"{label}: no step was saturated at the peak rate (the busiest, step {job['busiest_step']}, busy "
                f"{job['busiest_busy_fraction']:.0%}): the latency bound, not a step's capacity, holds it there.")
    group = max((g for g in space.groups if g.step == job["bottleneck_step"]), key=lambda g: _mean_busy(g, busy))
    settings = verified.candidate.group(group.step, group.group)
    head = (f"{group.name}'s {settings.replicas} {'replica is' if settings.replicas == 1 else 'replicas are'} "
            f"busy {_mean_busy(group, busy):.0%}")
    if not group.tuned:
        return head + "; the tuner does not choose its replicas, so only a faster step would lift it."
    more = _with_one_more(space, verified.candidate, group)
    unit = "GPU" if group.on_gpu else "CPU slot"
    now = estimator.peak(verified.candidate).rate_per_s or 0.0
    after = estimator.peak(more)
    gain = (after.rate_per_s or 0.0) - now
    beyond = "" if space.within_budget(more) else " (beyond the budget)"
    if gain <= 0.01 * max(now, 1e-9):
        neck = after.at_peak.bottleneck if after.at_peak is not None else group.name
        return head + f": one more {unit}{beyond} would add little, {neck} would bound it next."
    return head + f": one more {unit}{beyond} would add about {gain:.0f} items/s (predicted)."


def cores_sentence(space: TuneSpace, estimator: Estimator, candidate: Candidate, job: TableRow) -> str | None:
    """The host's cores as the bound, when the job's processes kept them busy; None when they did not.

    The job's own processes' CPU (its samples, over the job) against the
    host's usable cores; the step that takes most of the CPU per item is
    the one whose work elsewhere (a faster step, a GPU) would lift it most.
    """
    cores = estimator.bench.cores
    used = sum(json.loads(job.get("cpu_percent") or "{}").values()) / 100.0
    if not any(device < 0 for g in space.groups for device in candidate.group(g.step, g.group).devices) \
            or not saturated(used / cores.usable):
        return None
    pipeline = estimator.pipeline(candidate)
    per_item = pipeline.cpu_by_group()
    total = pipeline.cpu_per_item_s()
    heaviest = max(per_item, key=lambda name: per_item[name])
    share = f", {heaviest} takes {per_item[heaviest] / total:.0%} of it (profiled)" if total > 0 else ""
    return (f"the host's {cores.describe()} are busy {min(1.0, used / cores.usable):.0%}: more CPU replicas add "
            f"nothing; only less CPU per item would lift it{share}, so a GPU for {heaviest} would do most.")


def _mean_busy(g: GroupChoices, busy: Mapping[str, float]) -> float:
    """The mean busy fraction of a group's runners (named step{k}-g{group}-r{i} in the job log)."""
    values = [share for name, share in busy.items() if name.startswith(f"step{g.step}-g{g.group}-")]
    return sum(values) / len(values) if values else 0.0


def _with_one_more(space: TuneSpace, candidate: Candidate, target: GroupChoices) -> Candidate:
    replicas = space.replicas_of(candidate)
    replicas[(target.step, target.group)] += 1
    devices = {(g.step, g.group): candidate.group(g.step, g.group).devices
               for g in space.tuned_groups if g.on_gpu and g is not target}
    return space.candidate(replicas, space.batches_of(candidate), space.segments_of(candidate), devices)


# ---------------------------------------------------------------- the files

def best_document(space: TuneSpace, winner: Verified, request: Request, settings: VerifySettings) -> JsonObject:
    """The winner as a config that runs as is: its settings, and its measured peak rate as the default load."""
    best = winner.best
    assert best is not None
    run: JsonObject = {"mean_interval_ms": float(format_interval(best.mean_interval_ms)),
                           "videos": videos_for(best.rate_per_s, settings), "warmup": settings.warmup}
    if request.engine != DEFAULT_ENGINE:
        run["engine"] = request.engine
    description = (f"rnb-tune's best for p{request.percentile:g} < {request.bound_ms:g} ms on {request.budget}: "
                   f"{space.label(winner.candidate)}; measured {best.rate_per_s:.4g} req/s with p{request.percentile:g} "
                   f"{best.latency_ms:.3g} ms (job {best.job_dir.name if best.job_dir else '-'})")
    return space.document_for(winner.candidate, run=run, description=description)


def write_report(out: Path, space: TuneSpace, outcome: Outcome, settings: VerifySettings) -> None:
    """All of the report's files; best.json last, and only with a winner."""
    found = outcome.search
    rules = settings.rules
    rows = candidate_rows(space, found, outcome.verified, rules)
    write_parquet_atomic(out / CANDIDATES, rows_to_table(rows))
    write_plot_png(out / PLOT, space, found, outcome.verified, outcome.winner, outcome.request.bound_ms)
    html_text = report_page(space, outcome, rows, settings)
    partial = out / (REPORT + ".partial")
    partial.write_text(html_text, encoding="utf-8")
    os.replace(partial, out / REPORT)
    if outcome.winner is not None:
        write_json_atomic(out / BEST, best_document(space, outcome.winner, outcome.request, settings))


def table_columns(percentile: float) -> tuple[tuple[str, str], ...]:
    """The candidates table's (title, column) pairs."""
    q = _stat(percentile)
    return (("rank", "rank"), ("settings", "short_label"), ("devices", "devices_used"),
            ("predicted req/s", "predicted_peak_rate_per_s"), ("predicted p50 ms", "predicted_p50_ms"),
            (f"predicted p{percentile:g} ms", f"predicted_{q}_ms"), ("predicted bottleneck", "predicted_bottleneck"),
            (f"predicted p{percentile:g} ms at the lowest rate tried", f"predicted_{q}_ms_at_lowest_rate"),
            ("measured req/s", "measured_peak_rate_per_s"), (f"measured p{percentile:g} ms", f"measured_{q}_ms"),
            ("pruned", "pruned"))


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def report_page(space: TuneSpace, outcome: Outcome, rows: Sequence[TableRow], settings: VerifySettings) -> str:
    rules = settings.rules
    request = outcome.request
    found = outcome.search
    q = request.percentile
    body = [paragraph(f"config {request.config}; budget {request.budget}; bound p{q:g} < {request.bound_ms:g} ms; "
                      f"objective {request.goal.objective}"
                      + (f" (target {request.goal.target_rate:g} items/s)" if request.goal.target_rate else "")
                      + f"; search {request.search}; engine {request.engine}."),
            paragraph(f"{len(found.evaluated)} candidates predicted, {len(found.pruned)} pruned, "
                      f"{len(outcome.verified)} verified"
                      + (f" (each rate by the majority of up to {settings.repeats} jobs; its median job is "
                         "shown)" if settings.repeats > 1 else "") + "; " + ", ".join(
                          f"{phase} {seconds:.0f} s" for phase, seconds in outcome.seconds.items()) + ".", "note")]
    winner = outcome.winner
    if winner is not None and winner.best is not None:
        body.append(paragraph(f"Best, as measured: {space.label(winner.candidate)}: {winner.best.rate_per_s:.4g} req/s "
                              f"with p{q:g} {winner.best.latency_ms:.3g} ms (best.json runs it as is); "
                              f"{resolution_note(winner)}", "bounds"))
    else:
        body.append(paragraph(f"No finalist met p{q:g} < {request.bound_ms:g} ms as measured; no best.json was written.",
                              "bounds"))
    body.append("<h2>Throughput against latency</h2>")
    predicted, measured = plot_points(space, found, outcome.verified)
    best = None if winner is None or winner.best is None else Point("winner", winner.best.rate_per_s,
                                                                    winner.best.latency_ms)
    body.append(figure(pareto_figure(predicted, measured, best, request.bound_ms, q), "pareto"))
    body.append("<h2>Candidates</h2>")
    shown = list(rows)[:MAX_TABLE_ROWS]
    best_index = next((i for i, r in enumerate(shown) if winner is not None and r["key"] == winner.candidate.key), None)
    columns = table_columns(q)
    body.append(table([title for title, _ in columns], [[_cell(r.get(c)) for _, c in columns] for r in shown], best_index))
    if len(rows) > MAX_TABLE_ROWS:
        body.append(paragraph(f"{len(rows) - MAX_TABLE_ROWS} more candidates are in {CANDIDATES}.", "note"))
    body.append("<h2>Finalists, as measured</h2>")
    for index, verified in enumerate(outcome.verified):
        body.extend(_finalist(space, found.estimator, verified, index, q, rules))
    body.append("<h2>Profiles</h2>")
    body.append(table(["profiled", "model", "calls", "mean ms", "p50 ms", "p99 ms", "held mean ms", "CPU ms per call",
                       "CPU fraction", "others' cores", "job"],
                      [profile_row(what, p) for what, p in outcome.profiles]))
    return page(f"rnb-tune: {Path(request.config).name}", body)


def _finalist(space: TuneSpace, estimator: Estimator, verified: Verified, index: int, q: float,
              rules: ValidityRules) -> list[str]:
    heading = f"finalist {index + 1}: {space.label(verified.candidate)}"
    parts = [f"<h3>{heading}</h3>"]
    trials = [[format_interval(t.mean_interval_ms), f"{t.rate_per_s:.4g}",
               "target not reached" if math.isinf(t.latency_ms) else f"{t.latency_ms:.3g}",
               "-" if t.job_dir is None else t.job_dir.name] for t in verified.trials]
    parts.append(table(["-mi", "req/s", f"p{q:g} ms", "job"], trials))
    best = verified.best
    if best is None or best.job_dir is None:
        parts.append(paragraph("No measured rate met the bound; the lowest tried is in the table.", "bounds"))
        return parts
    job = load_jobs([best.job_dir], rules=rules).jobs.to_pylist()[0]
    parts.append(paragraph(bounding_sentence(space, estimator, verified, job), "bounds"))
    parts.extend(job_section(job, f"its job at the peak rate, {best.rate_per_s:.4g} req/s: {job['job_id']}",
                             f"finalist-{index + 1}"))
    return parts


def profile_row(what: str, profile: Profile) -> list[str]:
    """A profile's calls in ms: what a call of the group occupied its runner, the harness's part included, the
    CPU it spent, and the cores other work on the host used meanwhile (a profile of a busy host)."""
    emit = np.array(profile.emit_s) * 1000.0
    return [what, profile.key.model, str(len(emit)), f"{emit.mean():.3g}", f"{np.percentile(emit, 50):.3g}",
            f"{np.percentile(emit, 99):.3g}", f"{profile.mean_held_s * 1000:.3g}" if profile.held_s else "-",
            f"{profile.cpu.per_call_s * 1000:.3g}", f"{profile.cpu.fraction:.2f}", f"{profile.cpu.others_cores:.2f}",
            Path(profile.job_dir).name]
