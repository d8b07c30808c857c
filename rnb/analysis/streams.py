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


STREAM_HEADER: tuple[str, ...] = ("stream", "offered", "processed", "late", "dropped", "p50 ms", "p99 ms", "fps")
_WIDTHS = (6, 9, 11, 7, 9, 9, 9, 8)
SCREEN_ROWS = 20   # the per-stream rows a summary prints: a screenful; the rest are in meta.json and streams.csv


def format_streams(streams: Mapping[str, Json], rows: int = SCREEN_ROWS) -> str:
    """The summary's stream section: the totals in one line, then a row per stream, the first `rows` of them."""
    lines = [stream_totals(streams), "  " + "".join(f"{name:>{width}}" for name, width in zip(STREAM_HEADER, _WIDTHS))]
    every = stream_rows(streams)
    lines.extend("  " + "".join(f"{cell:>{width}}" for cell, width in zip(row, _WIDTHS)) for row in every[:rows])
    if len(every) > rows:
        lines.append(f"  ... and {len(every) - rows} more streams: every stream is in meta.json (streams.per_stream) "
                     "and in streams.csv")
    return "\n".join(lines)


def stream_totals(streams: Mapping[str, Json]) -> str:
    """One line: how many streams at what rate and policy, and their frames offered, processed, late, dropped."""
    missed = missed_fraction(streams)
    return (f"streams: {streams.get('count')} at {_number(streams, 'fps'):g} fps, policy {streams.get('policy')}, "
            f"deadline {_number(streams, 'deadline_ms'):.1f} ms: {_count(streams, 'offered')} frames offered, "
            f"{_count(streams, 'processed')} processed, {_count(streams, 'late')} late, {_count(streams, 'dropped')} "
            f"dropped" + ("" if missed is None else f" ({missed:.1%} missed)"))


def stream_rows(streams: Mapping[str, Json]) -> list[list[str]]:
    """A row of cells per stream, in STREAM_HEADER's order."""
    per_stream = streams.get("per_stream")
    return [[str(_count(entry, key)) for key in ("stream", "offered", "processed", "late", "dropped")]
            + [_cell(entry, key) for key in ("p50_ms", "p99_ms", "fps")]
            for entry in (per_stream if isinstance(per_stream, list) else []) if isinstance(entry, dict)]


def _count(record: Mapping[str, Json], key: str) -> int:
    value = record.get(key)
    return int(value) if isinstance(value, (int, float)) else 0


def _number(record: Mapping[str, Json], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _cell(record: Mapping[str, Json], key: str) -> str:
    value = record.get(key)
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def few_frames(streams: Mapping[str, Json], minimum: int) -> str | None:
    """The validity rule of a camera-stream job: every stream offered at least `minimum` frames; None when it did."""
    per_stream = streams.get("per_stream")
    short = [entry for entry in (per_stream if isinstance(per_stream, list) else [])
             if isinstance(entry, dict) and _count(entry, "offered") < minimum]
    if not short:
        return None
    fewest = min(_count(entry, "offered") for entry in short)
    return (f"{len(short)} of {_count(streams, 'count')} streams offered fewer than {minimum} frames each "
            f"(the fewest {fewest}).")


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
