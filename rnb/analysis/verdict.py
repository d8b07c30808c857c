"""What a job's verdict adds to RnB's own rules: an open loop's load served, and a LoadGen scenario's rules.

Without `--scenario` a job is judged by RnB's rules (rnb.analysis.jobs:
long and full enough, its p99 bounded), and a job whose requests were
offered at their due times whatever happened to earlier ones (Poisson, a
trace, a rate schedule, camera streams under the queue policy) must also
have been served as fast as it was offered: otherwise its queue grew all
through the measured window, and its latencies measure how long the job
ran, not the pipeline.  With `--scenario` the job is judged by LoadGen's
rules for that scenario instead (rnb.analysis.loadgen_rules), over the
same items RnB measured.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from rnb.analysis.loadgen_rules import RuleSettings, Samples, Verdict, judge
from rnb.core.stages import ENQUEUE, StepEvents, event_seconds
from rnb.load import DUE_FIELD, SCENARIOS, LoadSettings, logged_mode, logged_settings

# Served this much slower than offered, a job's queue grew: 5 % of a second's requests still waiting each second.
OVERLOADED_BY = 0.05
ENDS = 20            # the queue's growth is read off the first and the last twentieth of the requests
MIN_RATE_ITEMS = ENDS   # fewer, and each twentieth is less than one request: one late item would decide the verdict


def overloaded(args: Mapping[str, object], measured: pa.Table, num_steps: int) -> str | None:
    """`overloaded: offered 254/s, served 174/s.` for an open-loop job whose measured requests were served more than
    OVERLOADED_BY slower than they were offered; None otherwise (and for a load that waits for the pipeline).

    Offered: the requests over the time their enqueues spanned.  Served: the
    same requests over that time and what the queue grew by meanwhile, read
    off how much longer the last twentieth of them took end to end than the
    first twentieth (medians, so that one late item at either end does not
    decide it), carried over the whole window.  A queue that grew and
    drained again within the window was served as offered.
    """
    settings = logged_settings(args)
    if not logged_mode(args).open_loop(settings) or measured.num_rows < MIN_RATE_ITEMS:
        return None
    enqueued = event_seconds(measured, ENQUEUE)
    order = np.argsort(enqueued, kind="stable")
    enqueued = enqueued[order]
    took = event_seconds(measured, StepEvents(num_steps - 1).handed_over)[order] - enqueued
    count, span = enqueued.size, float(enqueued[-1] - enqueued[0])
    ends = max(1, count // ENDS)
    # The two twentieths' middles lie count - ends requests apart; the window spans count - 1.
    grew = float(np.median(took[-ends:]) - np.median(took[:ends])) * (count - 1) / max(1, count - ends)
    if span <= 0 or grew <= OVERLOADED_BY / (1.0 - OVERLOADED_BY) * span:
        return None
    offered, served = (count - 1) / span, (count - 1) / (span + grew)
    return f"overloaded: offered {offered:.4g}/s, served {served:.4g}/s."


def scenario_verdict(args: Mapping[str, object], measured: pa.Table, issued: int, num_steps: int) -> Verdict | None:
    """The job judged by LoadGen's rules for its scenario; None for a job without one.

    `measured` holds the measured items' item_id, enqueue and final
    hand-over; `issued` counts every item the job finished (warm-up
    included), which LoadGen's min queries counts.
    """
    settings = logged_settings(args)
    rules = rule_settings(settings, _videos(args))
    if rules is None:
        return None
    scheduled = issue_times(measured)
    order = np.argsort(scheduled, kind="stable")
    samples = Samples(scheduled[order], event_seconds(measured, StepEvents(num_steps - 1).handed_over)[order],
                      measured.column("item_id").to_numpy(zero_copy_only=False)[order])
    return judge(rules, samples, issued // rules.samples_per_query)


def issue_times(measured: pa.Table) -> np.ndarray:
    """When each measured request was issued as LoadGen times it: its due time where its card records one (a
    scenario's Poisson or bulk requests, a trace, streams), else its enqueue (a closed loop's, or LoadGen's own)."""
    enqueued = event_seconds(measured, ENQUEUE)
    if DUE_FIELD not in measured.column_names:
        return enqueued
    due = event_seconds(measured, DUE_FIELD)
    return np.where(np.isnan(due), enqueued, due)


def rule_settings(settings: LoadSettings, videos: int) -> RuleSettings | None:
    """What LoadGen judges a job of these load settings by (and what --client loadgen passes it); None without a
    scenario.  -v counts requests; a multi-stream query holds --samples-per-query of them."""
    spec = SCENARIOS.get(settings.scenario or "")
    if spec is None:
        return None
    size = settings.samples_per_query if spec.name == "multi-stream" else 1
    target = settings.scenario_target_ms if spec.name == "server" else None
    return RuleSettings(spec, settings.min_duration_ms / 1000.0, videos // size, size,
                        None if target is None else target / 1000.0)


def _videos(args: Mapping[str, object]) -> int:
    value = args.get("videos")
    return value if isinstance(value, int) else 0
