"""The original RnB repository's config vocabulary, mapped onto this project's models.

RnB's configs (`config/*.json` there) name classes of its own tree, such as
`models.r2p1d.model.R2P1DLoader`, that decode with NVVL and load a checkpoint
from a fixed path on RnB's machines. They run here as published: each RnB
class path is replaced by the model that does the same job here, with the
geometry RnB's classes hard-wired (1 or 15 clips per video drawn 10:1, clips
of 8 frames at 112x112) supplied where the config does not say otherwise,
and RnB's own keywords translated. Every replacement becomes a note that the
job log keeps, so a reader of the results knows what actually ran.

RnB's `video_path_iterator` walked a fixed directory of `label/video.mp4`
files; it becomes a videos source over that directory's glob, which
`--dataset "DIR/*/*.mp4"` points at the user's own MP4s.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from rnb.core.records import Json, JsonObject
from rnb.pipeline.config_records import describe

RNB_CLIPS: JsonObject = {"choices": [1, 15], "weights": [10, 1]}
RNB_GEOMETRY: Mapping[str, Json] = {"num_clips": RNB_CLIPS, "clip_length": 8, "size": 112}
RNB_VIDEO_GLOB = "/cmsdata/ssd0/cmslab/Kinetics-400/sparta/*/*.mp4"  # where RnB's iterator looked
# RnB's LargeSmallSelector sent exactly the 15-clip videos to queue 1
LARGE_SMALL_THRESHOLD = 14

_GEOMETRY_NOTE = "1 or 15 clips weighted 10:1, 8 frames, 112x112, as RnB's class fixed them"


@dataclass(frozen=True)
class ModelMapping:
    """What one RnB model class runs as here."""

    model: str
    defaults: Mapping[str, Json] = field(default_factory=dict)  # step keywords set where the config has none
    what: str = ""


MODELS: dict[str, ModelMapping] = {
    "models.r2p1d.model.R2P1DLoader": ModelMapping("models.episode.EpisodeLoader", RNB_GEOMETRY, _GEOMETRY_NOTE),
    "models.r2p1d.model.R2P1DRunner": ModelMapping("models.r2p1d.R2P1DRunner", RNB_GEOMETRY, _GEOMETRY_NOTE),
    "models.r2p1d.model.R2P1DSingleStep": ModelMapping("models.r2p1d.R2P1DSingleStep", RNB_GEOMETRY, _GEOMETRY_NOTE),
    "models.r2p1d.model.R2P1DAggregator": ModelMapping(
        "models.aggregator.Aggregator", {}, "it merges the segments its time cards name; `aggregate` is checked"),
    "batcher.Batcher": ModelMapping(
        "models.batcher.Batcher", RNB_GEOMETRY, "a group without `batch` gets 1, RnB's default, not -b"),
}
SELECTORS: dict[str, tuple[str, Mapping[str, Json]]] = {
    "models.r2p1d.model.LargeSmallSelector": ("selector.LargeSmallSelector", {"threshold": LARGE_SMALL_THRESHOLD}),
}
ITERATORS: dict[str, Mapping[str, Json]] = {
    "models.r2p1d.model.R2P1DVideoPathIterator": {"videos": RNB_VIDEO_GLOB, "order": "sequential"},
}


@dataclass(frozen=True)
class Translated:
    """A config document in this project's vocabulary, and one note per thing that was mapped."""

    document: JsonObject
    notes: tuple[str, ...]


Fail = Callable[[str, str], NoReturn]  # (json_path, expected) -> raises


def translate(document: Mapping[str, Json], fail: Fail) -> Translated:
    """Replace RnB's class paths and keywords; a document that names none of them comes back unchanged."""
    top = copy.deepcopy(dict(document))
    notes: list[str] = []
    iterator = top.get("video_path_iterator")
    if isinstance(iterator, str) and iterator in ITERATORS and "source" not in top:
        del top["video_path_iterator"]
        top["source"] = dict(ITERATORS[iterator])
        notes.append(f"video_path_iterator: RnB's {iterator} runs as a videos source, one video per request "
                     f"through the episode byte-range cache, over the glob --dataset gives (\"DIR/*/*.mp4\" for "
                     f"RnB's label/video.mp4 layout), else over RnB's own {RNB_VIDEO_GLOB}")
    pipeline = top.get("pipeline")
    if isinstance(pipeline, list):
        for k, step in enumerate(pipeline):
            if isinstance(step, dict):
                notes.extend(_translate_step(step, k, pipeline, fail))
    return Translated(top, tuple(notes))


def _translate_step(step: JsonObject, k: int, pipeline: list[Json], fail: Fail) -> list[str]:
    notes = []
    queue_groups = step.get("queue_groups")
    groups = [group for group in queue_groups if isinstance(group, dict)] if isinstance(queue_groups, list) else []
    original = step.get("model")
    mapping = MODELS.get(original) if isinstance(original, str) else None
    if mapping is not None:
        step["model"] = mapping.model
        _clip_keywords(step, f"pipeline[{k}]", fail)
        for key, value in mapping.defaults.items():
            if key not in step and not any(key in group for group in groups):
                step[key] = copy.deepcopy(value)
        if original == "batcher.Batcher" and "batch" not in step:
            for group in groups:
                group.setdefault("batch", 1)
        if original == "models.r2p1d.model.R2P1DAggregator":
            _check_aggregate(step, k, pipeline, fail)
        notes.append(f"pipeline[{k}].model: RnB's {original} runs as {mapping.model} ({mapping.what})")
    for g, group in enumerate(groups):
        selector = group.get("queue_selector")
        if isinstance(selector, str) and selector in SELECTORS:
            replacement, kwargs = SELECTORS[selector]
            group["queue_selector"] = replacement
            given = group.get("queue_selector_kwargs", {})
            group["queue_selector_kwargs"] = {**kwargs, **given} if isinstance(given, dict) else given
            notes.append(f"pipeline[{k}].queue_groups[{g}].queue_selector: RnB's {selector} runs as {replacement} "
                         f"with threshold {LARGE_SMALL_THRESHOLD} (items of 15 clips to queue 1, the rest to queue 0)")
    return notes


def _clip_keywords(step: JsonObject, where: str, fail: Fail) -> None:
    """RnB's sampler keywords num_clips_population and num_clips_weights become one num_clips choice."""
    population, weights = step.pop("num_clips_population", None), step.pop("num_clips_weights", None)
    if population is None and weights is None:
        return
    if "num_clips" in step:
        fail(f"{where}.num_clips", "expected either num_clips or RnB's num_clips_population and num_clips_weights, "
                                   "found both")
    step["num_clips"] = {"choices": population if population is not None else RNB_CLIPS["choices"],
                         "weights": weights if weights is not None else RNB_CLIPS["weights"]}


def _check_aggregate(step: JsonObject, k: int, pipeline: list[Json], fail: Fail) -> None:
    """RnB's aggregator waited for `aggregate` segments; here it merges the segments each item was split into."""
    aggregate = step.pop("aggregate", 1)
    # segments stay apart from the step that splits an item until a step merges them
    segments = next((s["num_segments"] for s in reversed(pipeline[:k])
                     if isinstance(s, dict) and s.get("num_segments", 1) != 1), 1)
    if aggregate != segments:
        fail(f"pipeline[{k}].aggregate", f"expected the number of segments each item arrives in ({segments}, "
                                         f"the num_segments of an earlier step), found {describe(aggregate)}")
