"""The tables a person reads (analyze.py's jobs table, the sweep's, --compare) show each job's load, its frames missed
and its bottleneck, not only the columns of --csv."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from rnb.analysis.loads import load_words, schedule_spans
from rnb.analysis.report import SUMMARY_COLUMNS, format_compare, format_summary


@pytest.mark.parametrize(("args", "words"), [
    ({"mean_interval_ms": 3.0}, "poisson 333.3/s"),
    ({}, "poisson 333.3/s"),   # a log from before the load keys: the defaults ran
    ({"mean_interval_ms": 0}, "bulk (all at once)"),
    ({"concurrency": 8, "mean_interval_ms": None}, "closed loop, 8 in flight"),
    ({"streams": 4, "fps": 15.0, "stream_policy": "drop"}, "4 x 15 fps, drop"),
    ({"arrivals": "logs/261201_193337-toy-mi2-v200"}, "trace 261201_193337-toy-mi2-v200"),
    ({"rate_schedule": "100@10s,300@5s"}, "schedule 100@10s,300@5s"),
])
def test_a_load_in_a_few_words(args: dict[str, object], words: str) -> None:
    assert load_words(args) == words


def stream_job(job_id: str, policy: str, late: int, dropped: int, busy: float) -> dict[str, object]:
    """A jobs-table row of a 4-stream job of 400 frames, its one step `busy`."""
    record = {"count": 4, "fps": 30, "policy": policy, "deadline_ms": 250.0, "per_stream": []}
    missed = late + (dropped if policy == "drop" else 0)
    return {"job_id": job_id, "config": "streams-example", "load_mode": "streams", "streams": 4, "fps": 30.0,
            "stream_policy": policy, "termination_reason": "target reached", "validity": "VALID",
            "invalid_because": None, "frames_offered": 400, "frames_processed": 400 - dropped, "frames_late": late,
            "frames_dropped": dropped, "frames_missed_fraction": missed / 400, "streams_record": json.dumps(record),
            "busiest_step": 0, "busiest_busy_fraction": busy, "bottleneck_step": 0 if busy >= 0.8 else None,
            "step_models": '["models.toy.AsyncSleep"]', "num_steps": 1, "config_path": "config/streams-example.json"}


def test_the_jobs_table_shows_the_load_the_frames_missed_and_the_bottleneck() -> None:
    jobs = pa.Table.from_pylist([stream_job("q", "queue", 48, 0, 0.97), stream_job("d", "drop", 0, 87, 0.40),
                                 stream_job("ok", "queue", 0, 0, 0.30)])
    header, _, *rows = format_summary(jobs).splitlines()
    titles = [title for title, _ in SUMMARY_COLUMNS]
    assert [title in header for title in ("load", "missed (late/dropped)", "bottleneck")] == [True] * 3
    cells = {row.split()[0]: row for row in rows}
    assert "4 x 30 fps, queue" in cells["q"] and "12.0% (48/0)" in cells["q"] and "step 0 97%" in cells["q"]
    assert "4 x 30 fps, drop" in cells["d"] and "21.8% (0/87)" in cells["d"] and "host stall, step 0 40%" in cells["d"]
    assert "0.0% (0/0)" in cells["ok"] and "none (step 0 30%)" in cells["ok"]
    assert len(titles) == len(set(titles))


def test_compare_shows_the_stream_figures_and_the_bottleneck() -> None:
    text = format_compare(stream_job("q", "queue", 48, 0, 0.97), stream_job("d", "drop", 0, 87, 0.40))
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}
    assert rows["load_mode"] == ["streams", "streams", "-"]
    assert rows["stream_policy"] == ["queue", "drop", "-"]
    assert rows["streams"] == ["4", "4", "1.000"]
    assert rows["frames_dropped"] == ["0", "87", "-"]
    assert rows["frames_missed_fraction"] == ["0.12", "0.217", "1.812"]
    assert rows["busiest_busy_fraction"] == ["0.97", "0.4", "0.412"]
    assert rows["bottleneck_step"] == ["0", "-", "-"]


def test_a_schedules_spans_count_their_requests_over_every_repetition() -> None:
    """100@0.5s,300@0.25s repeats every 0.75 s: 0.8 s is the first span again; a request stamped a hair before the
    job's start (the client may beat main's stamp) is the first span's, an unfinished one is nobody's served."""
    enqueued = np.array([-0.0001, 0.1, 0.6, 0.8, 0.9])
    finished = np.array([0.01, 0.11, 0.61, 0.81, np.nan])
    spans = schedule_spans("100@0.5s,300@0.25s", enqueued, finished, 1.0)
    assert [(s["span"], s["begins_s"], s["asked_per_s"], s["requests"]) for s in spans] == [
        ("100@0.5s", 0.0, 100.0, 4), ("300@0.25s", 0.5, 300.0, 1)]
    # Served in span 0's 0.75 s of the run (0-0.5 s and 0.75-1 s): 3 items; in span 1's 0.25 s: 1.
    assert [s["served_per_s"] for s in spans] == pytest.approx([3 / 0.75, 1 / 0.25])
    assert spans[1]["p99_ms"] == pytest.approx(10.0)
