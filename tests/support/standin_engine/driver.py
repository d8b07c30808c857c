"""The stand-in engine's driver: its job on this host, through the local engine's processes and the shared job ends."""
from __future__ import annotations

from rnb.engines.drivers import EngineJob
from rnb.engines.job import JobResult
from rnb.engines.local.driver import run_job

CALLED: list[str] = []   # the configs this driver ran, so a test sees the job came through the stand-in


def run(job: EngineJob) -> JobResult:
    CALLED.append(job.config.path)
    return run_job(job.config, job.args, job.placements, job.gpus)
