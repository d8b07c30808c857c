"""Who ran each item at each step, and which queue it waited in, as far as the job log tells.

The trace puts each item's slices on the track of the process that ran it,
and the busy fractions add up each process's time inside its model; both
need the same answer, so it is computed here once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rnb.core.records import Json, json_at

if TYPE_CHECKING:  # jobs.py builds its table from modules that use this one
    from rnb.analysis.job_dirs import Job

UNKNOWN = "replica not logged"


def replicas(job: Job, step: int) -> list[str]:
    """Which process ran each row's item at `step`, by the replica the job log names (group{k}, instance{k}).

    Logs written before the route was logged name only the device: there
    the runner of the step on the row's device stands in, and several
    replicas on one device, which cannot be told apart, share one track
    named as such.
    """
    runners = [p for p in job.meta.processes if p.role == "runner" and p.step == step]
    unknown = f"step {step}: {UNKNOWN}"
    if len(runners) == 1:
        return [runners[0].name] * job.timings.num_rows
    group, instance = f"group{step}", f"instance{step}"
    if group in job.timings.column_names and instance in job.timings.column_names:
        by_replica = {(p.group, p.instance): p.name for p in runners}
        pairs = zip(job.timings.column(group).to_pylist(), job.timings.column(instance).to_pylist())
        return [by_replica.get(pair, unknown) for pair in pairs]
    column = f"device{step}"
    devices = job.timings.column(column).to_pylist() if column in job.timings.column_names else []
    names = []
    for device in devices or [None] * job.timings.num_rows:
        matching = [p for p in runners if p.device == device]
        names.append(matching[0].name if len(matching) == 1 else unknown)
    return names


def queue_labels(job: Job, step: int, replica_names: list[str]) -> list[str]:
    """The input queue of each row's replica at `step`, as the trace names it."""
    if step == 0:
        return ["requests → step 0"] * len(replica_names)
    groups = json_at(job.config, "pipeline", step, "queue_groups")
    in_queues = [json_at(group, "in_queue") for group in groups] if isinstance(groups, list) else []
    by_group: dict[int | None, Json] = dict(enumerate(in_queues))   # a process's group may be None
    group_of = {p.name: p.group for p in job.meta.processes}
    queues = set(by_group.values())
    single = next(iter(queues)) if len(queues) == 1 else None
    labels = []
    for name in replica_names:
        queue = by_group.get(group_of[name]) if name in group_of else single
        labels.append(f"step {step - 1} → step {step}" + (f" (queue {queue})" if queue is not None else f" ({UNKNOWN})"))
    return labels
