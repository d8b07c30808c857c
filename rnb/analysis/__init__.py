"""Job logs read back into tables, reports, plots and load sweeps.

    from rnb.analysis import load_jobs
    jobs, items = load_jobs("logs")
"""
from rnb.analysis.jobs import Job, JobLogError, JobTables, ValidityRules, load_jobs, read_job

__all__ = ["Job", "JobLogError", "JobTables", "ValidityRules", "load_jobs", "read_job"]
