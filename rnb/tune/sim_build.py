"""A candidate as the simulation sees it: its groups, their profiled services, the cores and hops they share."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rnb.core.termination import POLL_S  # a plain group's receive timeout, as the runner's
from rnb.engines.registry import spans_hosts
from rnb.pipeline.config import merges_segments
from rnb.pipeline.plan import thread_share
from rnb.tune.profile import Bench, Form, Profile, ProfileKey
from rnb.tune.profile_plan import forms_of, profile_key, unit_plan
from rnb.tune.sim_records import Background, EstimateError, Service, SimGroup, SimPipeline
from rnb.tune.space import Candidate, TuneSpace


def pipeline_of(space: TuneSpace, candidate: Candidate, profiles: Mapping[ProfileKey, Profile],
                bench: Bench) -> SimPipeline:
    """The candidate as the simulation sees it: every group with its replicas and its profiled service.

    Each CPU replica computes on the thread share the harness would give it
    in this candidate (rnb.pipeline.plan.thread_share over its CPU runners;
    on Ray its node's CPU resource over the CPU runners on the node), not
    the one of its profiling job; a "threads" keyword wins, as there.  On
    Ray each group computes on its node label's pool of cores (bench.hosts).
    """
    plan = unit_plan(space)
    forms = forms_of(space, candidate)
    by_group: dict[tuple[str, str, str], list[Profile]] = {}   # the same group at other forms
    for profile in profiles.values():
        by_group.setdefault((profile.key.model, profile.key.keywords, profile.key.input_shapes), []).append(profile)
    shares = _thread_shares(space, candidate, bench)
    groups = []
    used = []
    for g in space.groups:
        step = space.config.steps[g.step]
        group = step.queue_groups[g.group]
        form = forms[(g.step, g.group)]
        key = profile_key(space, plan, g, form, bench)
        if key not in profiles:
            raise EstimateError(f"no profile of {g.name} ({g.model}) at {_describe(form)}; profile it first.")
        profile = profiles[key]
        used.append(profile)
        settings = candidate.group(g.step, g.group)
        siblings = [p for p in by_group[(key.model, key.keywords, key.input_shapes)]
                    if (p.key.form.segments, p.key.form.splits, p.key.form.batch) == (form.segments, form.splits, form.batch)]
        share = shares[_node_of(bench, group.node)]
        threads = int(group.model_kwargs.get("threads", share if settings.devices[0] < 0 else bench.cores.affinity))
        groups.append(SimGroup(
            name=g.name, step=g.step, devices=settings.devices, in_queue=group.in_queue, out_queues=group.out_queues,
            slots=step.num_shared_tensors, service=service_of(profile, form.cards, siblings),
            splits=candidate.steps[g.step].segments, batch=settings.batch,
            timeout_s=float(group.model_kwargs.get("timeout_ms", 50.0)) / 1000.0 if settings.batch else POLL_S,
            merges=merges_segments(g.model), cpu_fraction=profile.cpu.fraction,
            profiled_threads=max(1, profile.cpu.threads), threads=max(1, threads),
            pool=bench.hosts.pool_of(group.node) if spans_hosts(bench.engine) else 0))
    background = Background(float(np.median([p.cpu.client_per_item_s for p in used])),
                            float(np.median([p.cpu.main_per_item_s for p in used])),
                            float(np.median([p.cpu.daemons_per_hop_s for p in used])),
                            float(np.median([p.cpu.hop_per_item_s for p in used])) if spans_hosts(bench.engine) else 0.0)
    pools = (bench.hosts.cores if spans_hosts(bench.engine) else ()) or (bench.cores.usable,)
    hops = [p.hop_latency_s for p in used if p.hop_latency_s > 0]
    delivery = float(np.median(hops)) if hops else 0.0
    return SimPipeline(tuple(groups), space.num_steps, pools[0], background, pools[1:], delivery,
                       delivery if spans_hosts(bench.engine) else 0.0)


def _node_of(bench: Bench, node: str | None) -> str | None:
    """A group's node label where the engine shares threads per node (Ray, a label whose CPUs are known)."""
    return node if spans_hosts(bench.engine) and bench.hosts.cpus_of(node) is not None else None


def _thread_shares(space: TuneSpace, candidate: Candidate, bench: Bench) -> dict[str | None, int]:
    """A CPU runner's thread share per node label (None: the host's), as the engine gives it."""
    runners: dict[str | None, int] = {}
    for g in space.groups:
        node = _node_of(bench, space.config.steps[g.step].queue_groups[g.group].node)
        runners[node] = runners.get(node, 0) + sum(1 for device in candidate.group(g.step, g.group).devices
                                                   if device < 0)
    return {node: thread_share(bench.hosts.cpus_of(node) or bench.cores.affinity, count)
            for node, count in runners.items()}


def _describe(form: Form) -> str:
    parts = [f"{form.cards} items per call"]
    if form.batch > 1:
        parts.append(f"batch {form.batch}")
    if form.segments > 1:
        parts.append(f"{form.segments} segments per item")
    if form.splits > 1:
        parts.append(f"split in {form.splits}")
    return ", ".join(parts)


def service_of(profile: Profile, cards: int, siblings: Sequence[Profile]) -> Service:
    """A profile as samples, with the factor a partial batch of m < cards items costs against a full one.

    The factor interpolates the mean call time linearly between the
    profiled sizes (a line through the two smallest below them).
    """
    sizes = sorted({p.key.form.cards: p.mean_emit_s for p in siblings}.items())
    xs = np.array([size for size, _ in sizes], dtype=float)
    ys = np.array([mean for _, mean in sizes], dtype=float)
    full = profile.mean_emit_s
    partial = []
    for m in range(1, cards + 1):
        if len(xs) >= 2 and m < xs[0]:
            slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            mean = ys[0] + slope * (m - xs[0])
        elif len(xs):
            mean = float(np.interp(m, xs, ys))
        else:
            mean = full
        partial.append(max(mean, 0.05 * full) / full if full > 0 else 1.0)
    return Service(profile.emit_s, profile.held_s, profile.inside_s or profile.emit_s, tuple(partial))
