"""The profiling jobs a space needs: the forms its candidates give each group, and the short pipeline measuring each."""
from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Sequence

import torch

from rnb.pipeline.config import merges_segments
from rnb.pipeline.plan import Placement, plan_runners
from rnb.tune.profile import Bench, Form, ProfileJob, ProfileKey
from rnb.tune.space import Candidate, GroupChoices, TuneSpace

FEEDER = "rnb.tune.instruments.Feeder"
SINK = "rnb.tune.instruments.Sink"
PROFILE_SLOTS = 4       # output slots of the feeder and the Batcher in a profiling job


def forms_of(space: TuneSpace, candidate: Candidate) -> dict[tuple[int, int], Form]:
    """The form of every group's calls in one candidate (only its batches and segments matter).

    A Batcher is profiled the way it runs in front of the group it feeds:
    whole items in, its batches split as they reach that group; its form
    says so (segments 1, splits = the segments its batches arrive in).
    """
    produced: dict[int, tuple[int, int]] = {}    # out_queue of the previous step -> (cards, segments) of a message
    forms: dict[tuple[int, int], Form] = {}
    for k, step in enumerate(space.config.steps):
        written: dict[int, tuple[int, int]] = {}
        splits = candidate.steps[k].segments
        merges = merges_segments(step.model)
        for gi, group in enumerate(step.queue_groups):
            cards, segments = (1, 1) if group.in_queue is None else produced[group.in_queue]
            batch = candidate.group(k, gi).batch
            forms[(k, gi)] = Form(cards, segments, splits) if batch is None else Form(cards, 1, segments * splits, batch)
            batch = batch or 1
            out = (cards * batch, (1 if merges else segments) * splits)
            for q in group.out_queues:
                written[q] = max(written.get(q, out), out)
        produced = written
    return forms


def all_forms(space: TuneSpace, candidates: Iterable[Candidate]) -> dict[tuple[int, int], set[Form]]:
    needed: dict[tuple[int, int], set[Form]] = {}
    for candidate in candidates:
        for where, form in forms_of(space, candidate).items():
            needed.setdefault(where, set()).add(form)
    return needed


def form_candidates(space: TuneSpace) -> list[Candidate]:
    """One candidate per combination of batches and segments: between them, every form any candidate has."""
    batchers = space.batcher_groups
    result = []
    for batch_values in itertools.product(*(g.batches for g in batchers)):
        batches = {(g.step, g.group): b for g, b in zip(batchers, batch_values)}
        for segments in itertools.product(*space.segments):
            result.append(space.candidate({(g.step, g.group): 1 for g in space.tuned_groups}, batches, segments))
    return result


def unit_plan(space: TuneSpace) -> list[Placement]:
    """The plan of the config with every Batcher at batch 1 and no segments: each group's per-item input.

    Only the first replica of each group, which is all a profile needs to know.
    """
    steps = []
    for step in space.config.steps:
        groups = tuple(dataclasses.replace(g, model_kwargs={**g.model_kwargs, "batch": 1})
                       if "batch" in g.model_kwargs else g for g in step.queue_groups)
        steps.append(dataclasses.replace(step, queue_groups=groups, num_segments=1))
    return [p for p in plan_runners(dataclasses.replace(space.config, steps=tuple(steps)), 1) if p.instance == 0]


def profile_key(space: TuneSpace, plan: Sequence[Placement], g: GroupChoices, form: Form, bench: Bench) -> ProfileKey:
    """The key of a group's profile at a form: what the profiler stores and the estimator looks up."""
    group = space.config.steps[g.step].queue_groups[g.group]
    keywords = json.dumps({k: v for k, v in group.model_kwargs.items() if k != "batch" or g.kind == "work"},
                          sort_keys=True, default=str)
    shapes = next(p.input_shapes for p in plan if (p.step, p.group) == (g.step, g.group))
    return ProfileKey(g.model, keywords, form, json.dumps(shapes), bench.device_kind, bench.engine, bench.host,
                      bench.cores)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_profiles(space: TuneSpace, bench: Bench, calls: int,
                  candidates: Sequence[Candidate] | None = None) -> list[ProfileJob]:
    """The profiling jobs every form of every work group needs (a Batcher is measured with the group it feeds)."""
    plan = unit_plan(space)
    needed = all_forms(space, form_candidates(space) if candidates is None else candidates)
    return [_profile_job(space, plan, g, form, bench, calls)
            for g in space.groups if g.kind == "work"
            for form in sorted(needed[(g.step, g.group)], key=dataclasses.astuple)]


def _profile_job(space: TuneSpace, plan: Sequence[Placement], g: GroupChoices, form: Form, bench: Bench,
                 calls: int) -> ProfileJob:
    """A feeder, the Batcher in front of the group (when it takes batches), the group, a sink."""
    config = space.config
    step = config.steps[g.step]
    group = step.queue_groups[g.group]
    final = g.step == space.num_steps - 1
    device = [bench.device]
    batcher = space.batcher_of(g)
    pipeline: list[dict[str, object]] = []
    if g.step > 0:
        producer = next(p for p in plan if p.step == g.step - 1 and group.in_queue in p.out_queues)
        shapes = next(p.input_shapes for p in plan if (p.step, p.group) == (g.step, g.group)) or ()
        pipeline.append({"model": FEEDER, "queue_groups": [{"gpus": device, "out_queues": [0]}],
                         "num_shared_tensors": PROFILE_SLOTS, "shapes": [list(s) for s in shapes],
                         "dtypes": [_dtype_name(d) for d in producer.output_dtypes]})
        # A group further down a batched pipeline gets its batches from a Batcher like the nearest one upstream
        # (its model and keywords, its timeout among them).
        lender = batcher or next((b for b in reversed(space.batcher_groups) if b.step < g.step), None)
        if lender is not None and (batcher is not None or form.cards > 1):
            kwargs = dict(config.steps[lender.step].queue_groups[lender.group].model_kwargs)
            pipeline.append({"model": config.steps[lender.step].model,
                             "queue_groups": [{"gpus": device, "in_queue": 0, "out_queues": [0]}],
                             "num_shared_tensors": PROFILE_SLOTS, **kwargs, "batch": form.cards})
        pipeline[-1]["num_segments"] = form.segments
    measured: dict[str, object] = {"model": step.model, **dict(group.model_kwargs),
                                "queue_groups": [{"gpus": device, **({"in_queue": 0} if pipeline else {}),
                                                  **({} if final else {"out_queues": [0]})}]}
    if not final:
        measured.update(num_shared_tensors=step.num_shared_tensors, num_segments=form.splits)
    pipeline.append(measured)
    if not final:
        pipeline.append({"model": SINK, "queue_groups": [{"gpus": device, "in_queue": 0}]})
    batcher_key = None
    if batcher is not None:
        batcher_key = profile_key(space, plan, batcher, Form(1, 1, form.segments, form.cards), bench)
    what = g.name + "".join(f" {name} {value}" for name, value in (
        ("at batch", form.cards), ("with segments", form.segments), ("split in", form.splits)) if value != 1)
    document = {"description": f"rnb-tune profile of {what} ({step.model})",
                "source": dict(config.source) if g.step == 0 else {"synthetic": True}, "pipeline": pipeline}
    return ProfileJob(g, form, profile_key(space, plan, g, form, bench), document, calls * form.cards,
                      len(pipeline) - (1 if final else 2), batcher_key, what)
