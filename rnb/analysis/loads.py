"""A job's load as the tables and pages name it: its mode and its figures, in a few words.

The jobs table holds the load as its keys (`load_mode`, `mean_interval_ms`,
`streams`, ...); a person reading a table of jobs wants them as one cell:
`poisson 333/s`, `4 x 30 fps, drop`, `schedule 100@10s,300@5s`.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rnb.load import logged_settings, mode_of


def load_words(row: Mapping[str, Any]) -> str:
    """The load of a jobs-table row (or meta.json's args) in a few words; a log without load keys ran the defaults."""
    settings = logged_settings(row)
    mode = mode_of(settings).name
    if mode == "poisson":
        return f"poisson {1000.0 / settings.mean_interval_ms:.4g}/s"
    if mode == "bulk":
        return "bulk (all at once)"
    if mode == "closed_loop":
        return f"closed loop, {settings.concurrency} in flight"
    if mode == "streams":
        return f"{settings.streams} x {settings.fps:g} fps, {settings.stream_policy}"
    if mode == "trace":
        return f"trace {Path(str(settings.arrivals)).name}"
    return f"schedule {settings.rate_schedule}"
