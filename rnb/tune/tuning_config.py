"""A tuning config read into its TuneSpace: the lists of choices taken out, the request checked against them.

Every check runs before anything is measured; what fails is a ConfigError
(the config's own sentence) or a TuneRequestError (the request against the
config), each exit 2 at the command line.
"""
from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rnb.core.model import Flushes
from rnb.pipeline.config import ConfigError, PipelineConfig, merges_segments, parse_config
from rnb.pipeline.dotted import load_object
from rnb.tune.space import Budget, GroupChoices, TuneRequestError, TuneSpace

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8)


def is_batcher(model: str) -> bool:
    """A batching step: its model holds inputs and flushes them (rnb.core.model.Flushes), and takes `batch`."""
    cls = load_object(model)
    return issubclass(cls, Flushes) and "batch" in inspect.signature(cls).parameters


def _choices(value: object, file: str, where: str) -> tuple[int, ...] | None:
    """A list of positive integers given in place of one (the tuner's choices); None where a single value is."""
    if not isinstance(value, list):
        return None
    if not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ConfigError(file, where, f"expected a non-empty list of integers >= 1 to choose from, found {json.dumps(value)}")
    return tuple(sorted(set(value)))


def read_space(document: Any, file: str, budget: Budget, batches: Sequence[int] | None = None,
               segments: Sequence[int] | None = None, max_replicas: int | None = None) -> TuneSpace:
    """Check a tuning config and the request against each other, before anything runs (ConfigError,
    TuneRequestError: exit 2).

    `batches` (--batch) are the sizes of every Batcher group whose config gives
    no list; `segments` (--segments) the num_segments of every step that may
    split (a later step merges segments) and gives no list.
    """
    if not isinstance(document, dict) or not isinstance(document.get("pipeline"), list):
        parse_config(document, file)  # the harness's own sentence for a document that is not a pipeline
    plain = copy.deepcopy(document)
    batch_lists: dict[tuple[int, int], tuple[int, ...]] = {}
    segment_lists: dict[int, tuple[int, ...]] = {}
    for k, step in enumerate(plain["pipeline"]):
        if not isinstance(step, dict):
            continue
        listed = _choices(step.get("num_segments"), file, f"pipeline[{k}].num_segments")
        if listed is not None:
            segment_lists[k] = listed
            step["num_segments"] = listed[0]
        step_batches = _choices(step.get("batch"), file, f"pipeline[{k}].batch")
        if step_batches is not None:
            step.pop("batch")
        for gi, group in enumerate(step.get("queue_groups") or []):
            if not isinstance(group, dict):
                continue
            group_batches = _choices(group.get("batch"), file, f"pipeline[{k}].queue_groups[{gi}].batch")
            if group_batches is not None:
                group["batch"] = group_batches[0]
                batch_lists[(k, gi)] = group_batches
            elif step_batches is not None:
                group["batch"] = step_batches[0]
                batch_lists[(k, gi)] = step_batches
    config = parse_config(plain, file)
    return _space(config, plain, budget, batch_lists, segment_lists, batches, segments, max_replicas)


def _space(config: PipelineConfig, plain: dict[str, Any], budget: Budget,
           batch_lists: Mapping[tuple[int, int], tuple[int, ...]], segment_lists: Mapping[int, tuple[int, ...]],
           batches: Sequence[int] | None, segments: Sequence[int] | None, max_replicas: int | None) -> TuneSpace:
    groups = _group_choices(config, budget, batch_lists, batches)
    segment_choices = _segment_choices(config, segment_lists, segments)
    cpu_tuned = _check_room(config, budget, groups)
    # By default a CPU group may take every slot the others leave it, a GPU group one replica per GPU.
    most = max_replicas if max_replicas is not None else max(
        len(budget.gpus), budget.cpu_slots - len(cpu_tuned) + 1 if cpu_tuned else 0)
    return TuneSpace(config, plain, tuple(groups), tuple(segment_choices), budget, max(1, most))


def _group_choices(config: PipelineConfig, budget: Budget, batch_lists: Mapping[tuple[int, int], tuple[int, ...]],
                   batches: Sequence[int] | None) -> list[GroupChoices]:
    """What the tuner may choose of each queue group: a Batcher's batches, a work group's devices."""
    groups: list[GroupChoices] = []
    last = len(config.steps) - 1
    for k, step in enumerate(config.steps):
        batcher = is_batcher(step.model)
        if batcher and k == last:
            raise TuneRequestError(f"{config.path}: pipeline[{k}] is a Batcher on the final step, which has no "
                                   "step after it to take its batches.")
        for gi, group in enumerate(step.queue_groups):
            if batcher:
                chosen = _batches_of(group.model_kwargs.get("batch"), batch_lists.get((k, gi)), batches)
                groups.append(GroupChoices(k, gi, step.model, "batcher", batches=chosen))
                continue
            on_cpu = all(gpu < 0 for gpu in group.gpus)
            if budget.cpu_only or not on_cpu:
                on_gpu = not budget.cpu_only
                groups.append(GroupChoices(k, gi, step.model, "work", on_gpu=on_gpu, final=k == last))
            elif budget.cpu_slots:
                groups.append(GroupChoices(k, gi, step.model, "work", final=k == last))
            else:  # a CPU group next to GPU groups, and no CPU slots to tune it with: kept as written
                groups.append(GroupChoices(k, gi, step.model, "work", fixed=group.gpus, final=k == last))
    return groups


def _batches_of(written: object, listed: tuple[int, ...] | None, batches: Sequence[int] | None) -> tuple[int, ...]:
    """A Batcher group's choices: its config's list, else --batch, else the one batch written, else the defaults."""
    if listed is not None:
        return listed
    if batches is not None:
        return tuple(sorted(set(batches)))
    if isinstance(written, int):
        return (written,)
    return DEFAULT_BATCHES


def _segment_choices(config: PipelineConfig, segment_lists: Mapping[int, tuple[int, ...]],
                     segments: Sequence[int] | None) -> list[tuple[int, ...]]:
    """Each step's num_segments to choose from: more than one only where a later step merges segments."""
    last = len(config.steps) - 1
    choices = []
    for k, step in enumerate(config.steps):
        may_split = k < last and any(merges_segments(later.model) for later in config.steps[k + 1:])
        if k in segment_lists:
            if not may_split and segment_lists[k] != (1,):
                raise TuneRequestError(f"{config.path}: pipeline[{k}].num_segments lists {list(segment_lists[k])}, "
                                       "but no later step merges segments (an aggregator).")
            choices.append(segment_lists[k])
        elif segments is not None and may_split:
            choices.append(tuple(sorted(set(segments))))
        else:
            choices.append((step.num_segments,))
    return choices


def _check_room(config: PipelineConfig, budget: Budget, groups: Sequence[GroupChoices]) -> list[GroupChoices]:
    """The budget against the groups it must hold, one replica each at least; the tuned CPU groups."""
    tuned = [g for g in groups if g.tuned]
    cpu_tuned = [g for g in tuned if not g.on_gpu]
    if budget.cpu_only and len(cpu_tuned) > budget.cpu_slots:
        raise TuneRequestError(
            f"{config.path}: a budget of {budget.cpu_slots} CPU slots cannot hold the {len(cpu_tuned)} work groups "
            f"({', '.join(g.name for g in cpu_tuned)}), each of which needs at least one replica.")
    if not budget.cpu_only and cpu_tuned and len(cpu_tuned) > budget.cpu_slots:
        raise TuneRequestError(
            f"{config.path}: --cpu-slots {budget.cpu_slots} cannot hold the {len(cpu_tuned)} CPU work groups "
            f"({', '.join(g.name for g in cpu_tuned)}), each of which needs at least one replica.")
    if not tuned:
        raise TuneRequestError(f"{config.path}: nothing to tune with {budget.describe()}: every work group is "
                               "on the CPU and the budget gives no CPU slots.")
    return cpu_tuned
