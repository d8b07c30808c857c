"""Job logs read back into tables, reports, plots and load sweeps.

    from rnb.analysis import load_jobs
    jobs, items = load_jobs("logs")
"""
from rnb.analysis.job_dirs import Job, read_job
from rnb.analysis.jobs import JobLogError, JobTables, ValidityRules, load_jobs

__all__ = ["Job", "JobLogError", "JobTables", "ValidityRules", "load_jobs", "read_job"]
