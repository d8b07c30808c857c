"""Job logs read back into tables, reports, plots and load sweeps.

    from rnb.analysis import load_jobs
    jobs, items = load_jobs("logs")
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rnb.analysis.jobs import Job, JobLogError, JobTables, ValidityRules, load_jobs, read_job

__all__ = ["Job", "JobLogError", "JobTables", "ValidityRules", "load_jobs", "read_job"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the harness takes its stage vocabulary from rnb.analysis.stages, and importing
    # this package must not pull in the log reader, which imports the harness's job log in turn.
    if name in __all__:
        return getattr(importlib.import_module("rnb.analysis.jobs"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
