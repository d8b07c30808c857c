"""The Ray engine's entry in rnb.engines.registry: the cluster found or started, then the job run on it.

Ray is imported only once `prepare` has set what it reads when first
imported, so this module imports the driver inside `run`.
"""
from __future__ import annotations

from rnb.engines.drivers import EngineJob
from rnb.engines.job import JobResult
from rnb.engines.ray import cluster
from rnb.pipeline.gpus import visible_gpu_count


def run(job: EngineJob) -> JobResult:
    """The job on Ray (rnb.engines.drivers.Driver): a cluster out of reach raises ClusterStartError, an
    EngineUnavailable; what the cluster cannot host, ConfigError."""
    address = cluster.resolve_address(job.args.ray_address)
    cluster.prepare(address)
    from rnb.engines.ray.driver import run_ray_job  # only now: Ray reads what prepare set when first imported

    return run_ray_job(job.config, job.args, job.placements, address,
                       machine_gpus=visible_gpu_count() if address is None else 0, allow_busy_gpus=job.allow_busy_gpus)
