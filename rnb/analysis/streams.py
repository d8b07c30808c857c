"""A camera-stream job's frames as the summary and analyze.py show them: offered, processed, late, dropped.

The figures are meta.json's `streams` (rnb.engines.streams.streams_record);
the late fraction here is the one the stream search bounds: late frames, and
under the drop policy dropped frames too, over the frames offered.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from rnb.core.records import Json


def missed_fraction(streams: Mapping[str, Json]) -> float | None:
    """Frames late (and, under `drop`, dropped) over frames offered; None when none was offered."""
    offered = _count(streams, "offered")
    missed = _count(streams, "late") + (_count(streams, "dropped") if streams.get("policy") == "drop" else 0)
    return missed / offered if offered else None


def format_streams(streams: Mapping[str, Json]) -> str:
    """The summary's stream section: the totals in one line, then a row per stream."""
    missed = missed_fraction(streams)
    head = (f"streams: {streams.get('count')} at {_number(streams, 'fps'):g} fps, policy {streams.get('policy')}, "
            f"deadline {_number(streams, 'deadline_ms'):.1f} ms: {_count(streams, 'offered')} frames offered, "
            f"{_count(streams, 'processed')} processed, {_count(streams, 'late')} late, {_count(streams, 'dropped')} "
            f"dropped" + ("" if missed is None else f" ({missed:.1%} missed)"))
    lines = [head, f"  {'stream':>6}{'offered':>9}{'processed':>11}{'late':>7}{'dropped':>9}{'p50 ms':>9}{'p99 ms':>9}"
                   f"{'fps':>8}"]
    per_stream = streams.get("per_stream")
    for entry in per_stream if isinstance(per_stream, list) else []:
        if isinstance(entry, dict):
            lines.append(f"  {_count(entry, 'stream'):>6}{_count(entry, 'offered'):>9}{_count(entry, 'processed'):>11}"
                         f"{_count(entry, 'late'):>7}{_count(entry, 'dropped'):>9}{_cell(entry, 'p50_ms'):>9}"
                         f"{_cell(entry, 'p99_ms'):>9}{_cell(entry, 'fps'):>8}")
    return "\n".join(lines)


def _count(record: Mapping[str, Json], key: str) -> int:
    value = record.get(key)
    return int(value) if isinstance(value, (int, float)) else 0


def _number(record: Mapping[str, Json], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _cell(record: Mapping[str, Json], key: str) -> str:
    value = record.get(key)
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def stream_columns(streams: Mapping[str, Json] | None) -> dict[str, Json]:
    """The jobs table's stream columns: the totals, the fraction missed, and the whole record as JSON text."""
    if streams is None:
        return {key: None for key in STREAM_COLUMNS}
    return {"stream_count": _count(streams, "count"), "frames_offered": _count(streams, "offered"),
            "frames_processed": _count(streams, "processed"), "frames_late": _count(streams, "late"),
            "frames_dropped": _count(streams, "dropped"), "frames_missed_fraction": missed_fraction(streams),
            "streams_record": json.dumps(streams)}


STREAM_COLUMNS: tuple[str, ...] = ("stream_count", "frames_offered", "frames_processed", "frames_late", "frames_dropped",
                                   "frames_missed_fraction", "streams_record")


def per_stream_missed(streams: Mapping[str, Json]) -> list[tuple[float, float]]:
    """Each stream's late and dropped frames as fractions of the frames it offered, in stream order."""
    fractions = []
    per_stream = streams.get("per_stream")
    for entry in per_stream if isinstance(per_stream, list) else []:
        if isinstance(entry, dict):
            offered = _count(entry, "offered") or 1
            fractions.append((_count(entry, "late") / offered, _count(entry, "dropped") / offered))
    return fractions
