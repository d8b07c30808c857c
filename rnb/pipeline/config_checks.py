"""A config's meaning checked before any process starts: its keys, steps, queue groups, queues and keywords.

Everything that can be checked without starting a process is checked here,
so that a bad config costs the user one sentence and exit code 2, never a
half-started job.
"""
from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Mapping
from typing import NoReturn

from rnb.core.model import merges_segments as model_merges_segments
from rnb.core.records import Json, JsonObject
from rnb.load import LOAD_KEYS
from rnb.pipeline.config_records import ConfigError, PipelineConfig, QueueGroup, Step, describe, did_you_mean
from rnb.pipeline.dotted import load_object
from rnb.pipeline.keyword_check import Misfit, declared_keywords, misfit
from rnb.pipeline.original import translate
from rnb.pipeline.run_keys import RUN_KEYS

DEFAULT_NUM_SHARED_TENSORS = 10

_TOP_KEYS = ("pipeline", "source", "run", "video_path_iterator", "description")
_STEP_KEYS = frozenset({"model", "queue_groups", "num_shared_tensors", "num_segments"})
_GROUP_KEYS = frozenset({"gpus", "in_queue", "out_queues", "queue_selector", "queue_selector_kwargs", "node"})
# model keywords the harness consumes itself (rnb.pipeline.plan), or supplies when the config does not (-b)
_HARNESS_KEYWORDS = frozenset({"threads"})
_SUPPLIED_KEYWORDS = frozenset({"batch"})
# A queue group's "node": a label value such as "loaders" (or "key=value" for any label key), in the
# characters Ray allows in label keys and values.
_NODE_LABEL = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._/-]*=)?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def parse_config(document: Json, file: str, path: str | None = None) -> PipelineConfig:
    """Validate an already parsed JSON document; `file` names it in error messages.

    Separate from load_config so that tools and tests can build configs in memory.
    """
    check = _Checker(file)
    given = check.as_object(document, "(top level)")
    translated = translate(given, check.fail)
    top = translated.document
    for key in top:
        if key not in _TOP_KEYS:
            check.fail(key, f"expected one of the top-level keys ({', '.join(_TOP_KEYS)}), found an unknown key"
                            f"{did_you_mean(key, _TOP_KEYS)}")
    if "description" in top:
        check.as_string(top["description"], "description")
    source = dict(check.as_object(top.get("source", {}), "source"))
    if "video_path_iterator" in top:
        if "video_path_iterator" in source:
            check.fail("video_path_iterator", "expected it either at top level (the old form) or in source, found both")
        # first, because a source's first key names its kind (rnb.pipeline.sources)
        source = {"video_path_iterator": top["video_path_iterator"], **source}
    if "video_path_iterator" in source:
        where = "video_path_iterator" if "video_path_iterator" in top else "source.video_path_iterator"
        check.as_class_path(source["video_path_iterator"], where, "__iter__")
    run = _parse_run(check, top.get("run", {}))
    if "pipeline" not in top:
        check.fail("pipeline", "expected a non-empty list of steps, found no such key")
    pipeline = check.as_list(top["pipeline"], "pipeline", "steps")
    steps = tuple(_parse_step(check, raw, k, len(pipeline)) for k, raw in enumerate(pipeline))
    for k in range(1, len(steps)):
        _check_queues_between(check, steps[k - 1], steps[k], k)
    _check_segments_merged(check, steps)
    return PipelineConfig(
        path=file if path is None else path,
        source=copy.deepcopy(source),
        steps=steps,
        run=run,
        raw=copy.deepcopy(given),
        notes=translated.notes,
    )



def _parse_run(check: _Checker, value: Json) -> JsonObject:
    run = check.as_object(value, "run")
    keys = {**LOAD_KEYS, **RUN_KEYS}
    for name, item in run.items():
        if name not in keys:
            check.fail(f"run.{name}", f"expected one of the run keys ({', '.join(keys)}), found an unknown key"
                                      f"{did_you_mean(name, list(keys))}")
        if not keys[name].accepts(item):
            check.fail(f"run.{name}", f"expected {keys[name].expected}, found {describe(item)}")
    return dict(run)


def _parse_step(check: _Checker, value: Json, k: int, num_steps: int) -> Step:
    where = f"pipeline[{k}]"
    raw = check.as_object(value, where)
    final = k == num_steps - 1
    if "model" not in raw:
        check.fail(f"{where}.model", "expected a dotted class path of the step's model, found no such key")
    model = check.as_class_path(raw["model"], f"{where}.model", "output_shape")
    if "queue_groups" not in raw:
        check.fail(f"{where}.queue_groups", "expected a non-empty list of queue groups, found no such key")
    if final and "num_shared_tensors" in raw:
        check.fail(
            f"{where}.num_shared_tensors",
            "expected no num_shared_tensors on the final step, which writes no tensors, "
            f"found {describe(raw['num_shared_tensors'])}",
        )
    num_shared = 0
    if not final:
        num_shared = check.as_integer(
            raw.get("num_shared_tensors", DEFAULT_NUM_SHARED_TENSORS), f"{where}.num_shared_tensors", 1
        )
    num_segments = check.as_integer(raw.get("num_segments", 1), f"{where}.num_segments", 1)
    if final and num_segments != 1:
        check.fail(
            f"{where}.num_segments",
            f"expected 1 on the final step, which has no next step to process segments, found {describe(num_segments)}",
        )
    step_kwargs = {key: item for key, item in raw.items() if key not in _STEP_KEYS}
    groups_raw = check.as_list(raw["queue_groups"], f"{where}.queue_groups", "queue groups")
    groups = tuple(
        _parse_group(check, group, f"{where}.queue_groups[{g}]", k, final, step_kwargs)
        for g, group in enumerate(groups_raw)
    )
    _check_keywords(check, model, where, step_kwargs, groups_raw)
    return Step(
        model=model,
        queue_groups=groups,
        num_shared_tensors=num_shared,
        num_segments=num_segments,
        model_kwargs=copy.deepcopy(step_kwargs),
    )


def _parse_group(
    check: _Checker, value: Json, where: str, k: int, final: bool, step_kwargs: Mapping[str, Json]
) -> QueueGroup:
    raw = check.as_object(value, where)
    if "gpus" not in raw:
        check.fail(f"{where}.gpus", "expected a non-empty list of GPU indices (-1 = CPU), found no such key")
    gpus_raw = check.as_list(raw["gpus"], f"{where}.gpus", "GPU indices (-1 = CPU)")
    gpus = tuple(check.as_integer(gpu, f"{where}.gpus[{i}]", -1) for i, gpu in enumerate(gpus_raw))

    in_queue = _in_queue(check, raw, where, k)
    out_queues = _out_queues(check, raw, where, final)

    selector = None
    if "queue_selector" in raw:
        selector = check.as_class_path(raw["queue_selector"], f"{where}.queue_selector", "select")
    selector_kwargs = check.as_object(raw.get("queue_selector_kwargs", {}), f"{where}.queue_selector_kwargs")
    if selector_kwargs and selector is None:
        check.fail(f"{where}.queue_selector_kwargs",
                   "expected it only beside a queue_selector, whose constructor takes it, found no queue_selector")
    group_kwargs = {key: item for key, item in raw.items() if key not in _GROUP_KEYS}
    model_kwargs = {**step_kwargs, **group_kwargs}
    if "threads" in model_kwargs:  # consumed by the harness (rnb.pipeline.plan), not passed to the model
        where_threads = f"{where}.threads" if "threads" in group_kwargs else f"pipeline[{k}].threads"
        check.as_integer(model_kwargs["threads"], where_threads, 1)
    return QueueGroup(
        gpus=gpus,
        in_queue=in_queue,
        out_queues=out_queues,
        queue_selector=selector,
        queue_selector_kwargs=copy.deepcopy(selector_kwargs),
        model_kwargs=copy.deepcopy(model_kwargs),
        node=_parse_node(check, raw.get("node"), f"{where}.node"),
    )


def _parse_node(check: _Checker, value: Json, where: str) -> str | None:
    """A group's Ray node label, if it names one (the local engine has one node and ignores it)."""
    if value is None:
        return None
    node = check.as_string(value, where)
    if not _NODE_LABEL.fullmatch(node):
        check.fail(where, f'expected a node label such as "loaders" or "key=value" (letters, digits, "-", "_", "."), '
                          f"found {describe(node)}")
    return node


def _check_keywords(check: _Checker, model: str, where: str, step_kwargs: Mapping[str, Json],
                    groups_raw: list[Json]) -> None:
    """Every model keyword must be a parameter of the model's constructor, of the type and in the range its
    annotation declares (rnb.pipeline.keyword_check), and every required one given.

    A misspelt or ill-typed keyword would otherwise pass validation and fail in every runner at start-up.
    """
    declared = declared_keywords(load_object(model))
    if declared is None:
        return
    by_name = {keyword.name: keyword for keyword in declared}
    listed = [keyword.name for keyword in declared if keyword.listed]
    places = [(where, step_kwargs)] + [
        (f"{where}.queue_groups[{g}]", {key: item for key, item in group.items() if key not in _GROUP_KEYS})
        for g, group in enumerate(groups_raw) if isinstance(group, dict)]  # each is: _parse_group checked them
    for place, kwargs in places:
        for key, value in kwargs.items():
            if key in _HARNESS_KEYWORDS:
                continue
            if key not in by_name:
                check.fail(f"{place}.{key}", f"expected a keyword that {model} takes ({', '.join(listed) or 'none'}), "
                                             f"found an unknown keyword{did_you_mean(key, listed)}")
            wrong = misfit(value, by_name[key].hint)
            if wrong is not None:
                check.fail(f"{place}.{key}{wrong.where}",
                           f"expected {wrong.expected}, found {describe(wrong.found)}{_choices_hint(wrong)}")
    for place, group_kwargs in places[1:]:
        for keyword in declared:
            given = keyword.name in step_kwargs or keyword.name in group_kwargs or keyword.name in _SUPPLIED_KEYWORDS
            if keyword.required and not given:
                check.fail(f"{place}.{keyword.name}", f"expected the keyword {keyword.name}, which {model} requires, "
                                                      "found no such key in the group or its step")


def _choices_hint(wrong: Misfit) -> str:
    """Where a list was given for one number: a tuning config's list of choices, which only rnb-tune reads."""
    if wrong.where or not isinstance(wrong.found, list) or not wrong.found:
        return ""
    if not all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in wrong.found):
        return ""
    return "; a list of choices is for rnb-tune (docs/tuner.md), which tries each and picks one"


def _in_queue(check: _Checker, raw: Mapping[str, Json], where: str, k: int) -> int | None:
    """A group's in_queue: none on step 0, which reads the request queue; required on every later step."""
    if k == 0:
        if "in_queue" in raw:
            check.fail(
                f"{where}.in_queue",
                f"expected no in_queue on step 0, which reads the request queue, found {describe(raw['in_queue'])}",
            )
        return None
    if "in_queue" not in raw:
        check.fail(
            f"{where}.in_queue", f"expected the index of one of the out_queues of pipeline[{k - 1}], found no such key"
        )
    return check.as_integer(raw["in_queue"], f"{where}.in_queue", 0)


def _out_queues(check: _Checker, raw: Mapping[str, Json], where: str, final: bool) -> tuple[int, ...]:
    """A group's out_queues: none on the final step; on every other step a list of distinct indices."""
    if final:
        if "out_queues" in raw:
            check.fail(
                f"{where}.out_queues", f"expected no out_queues on the final step, found {describe(raw['out_queues'])}"
            )
        return ()
    if "out_queues" not in raw:
        check.fail(f"{where}.out_queues", "expected a non-empty list of queue indices (integers >= 0), found no such key")
    queues_raw = check.as_list(raw["out_queues"], f"{where}.out_queues", "queue indices (integers >= 0)")
    out_queues = tuple(check.as_integer(q, f"{where}.out_queues[{i}]", 0) for i, q in enumerate(queues_raw))
    for i, queue in enumerate(out_queues):
        if queue in out_queues[:i]:
            check.fail(f"{where}.out_queues[{i}]", f"expected each queue index once, found {queue} twice")
    return out_queues


def _check_queues_between(check: _Checker, previous: Step, step: Step, k: int) -> None:
    """The in_queues of step k must be exactly the out_queues of step k-1: no lost, no orphan queue."""
    written = {q for group in previous.queue_groups for q in group.out_queues}
    for g, group in enumerate(step.queue_groups):
        if group.in_queue not in written:
            check.fail(
                f"pipeline[{k}].queue_groups[{g}].in_queue",
                f"expected one of the out_queues of pipeline[{k - 1}] {_set(written)}, found {group.in_queue}",
            )
    read = {group.in_queue for group in step.queue_groups if group.in_queue is not None}  # None only on step 0
    unread = sorted(written - read)
    if unread:
        check.fail(
            f"pipeline[{k}].queue_groups",
            f"expected a group with in_queue {unread[0]}, an out_queue of pipeline[{k - 1}] that nothing else reads, "
            f"found in_queues {_set(read)}",
        )


def _check_segments_merged(check: _Checker, steps: tuple[Step, ...]) -> None:
    """A step that splits items into segments needs a later step that merges them, or no item ever finishes."""
    for k, step in enumerate(steps):
        if step.num_segments > 1 and not any(merges_segments(later.model) for later in steps[k + 1:]):
            check.fail(f"pipeline[{k}].num_segments",
                       f"expected 1, or a later step whose model merges segments (merges_segments = True, such as "
                       f"models.aggregator.Aggregator), found {step.num_segments} and no such step after it")


def merges_segments(model: str) -> bool:
    """Whether a model class (already imported by validation) declares that it merges an item's segments."""
    return model_merges_segments(load_object(model))


def _set(values: set[int]) -> str:
    return "{" + ", ".join(str(v) for v in sorted(values)) + "}"



class _Checker:
    """Type checks that raise ConfigError naming the file and JSON path of the bad value."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, json_path: str, expected: str) -> NoReturn:
        raise ConfigError(self.file, json_path, expected)

    def as_object(self, value: Json, json_path: str) -> JsonObject:
        if not isinstance(value, dict):
            self.fail(json_path, f"expected an object, found {describe(value)}")
        return value

    def as_list(self, value: Json, json_path: str, of: str) -> list[Json]:
        if not isinstance(value, list) or not value:
            self.fail(json_path, f"expected a non-empty list of {of}, found {describe(value)}")
        return value

    def as_string(self, value: Json, json_path: str) -> str:
        if not isinstance(value, str):
            self.fail(json_path, f"expected a string, found {describe(value)}")
        return value

    def as_integer(self, value: Json, json_path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(json_path, f"expected an integer >= {minimum}, found {describe(value)}")
        return value

    def as_class_path(self, value: Json, json_path: str, method: str) -> str:
        """Import a dotted class path now, so a typo fails before any process is spawned."""
        module_name, _, name = value.rpartition(".") if isinstance(value, str) else ("", "", "")
        if not isinstance(value, str) or not module_name or not name:
            self.fail(
                json_path, f"expected a dotted class path such as \"package.module.Class\", found {describe(value)}"
            )
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                self.fail(
                    json_path, f"expected an importable module \"{module_name}\", found no module named \"{exc.name}\""
                )
            self.fail(
                json_path, f"expected module \"{module_name}\" to import, found it needs the missing module \"{exc.name}\""
            )
        except Exception as exc:  # any import-time failure of user code is a config problem to report, not a crash
            first_line = (str(exc).splitlines() or [""])[0]
            self.fail(
                json_path, f"expected module \"{module_name}\" to import, found {type(exc).__name__}: {first_line}"
            )
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            found = "nothing by that name" if cls is None else f"a value of type {type(cls).__name__}"
            self.fail(json_path, f"expected a class \"{name}\" in module \"{module_name}\", found {found}")
        if not callable(getattr(cls, method, None)):
            self.fail(json_path, f"expected class \"{value}\" to have a callable {method}, found none")
        return value
