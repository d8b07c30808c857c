"""The model keyword checker on its own: each kind of annotation a constructor may declare, and the shipped models."""
from __future__ import annotations

import inspect
from typing import Annotated, Literal

import pytest
import torch
from annotated_types import Gt, Interval, Lt

import models.aggregator
import models.batcher
import models.episode
import models.r2p1d
import models.toy
from rnb.core.model_keywords import TEST_HOOK, Count
from rnb.pipeline.keyword_check import Misfit, declared_keywords, misfit


@pytest.mark.parametrize("value, hint, found", [
    (3, int, None),
    (3.0, int, Misfit("", "an integer", 3.0)),
    (True, int, Misfit("", "an integer", True)),
    (3, float, None),
    (False, float, Misfit("", "a number", False)),
    (0, Count, Misfit("", "an integer >= 1", 0)),
    ("1", Count, Misfit("", "an integer >= 1", "1")),
    (6, Annotated[int, Interval(ge=1, le=5)], Misfit("", "an integer from 1 to 5", 6)),
    (0.0, Annotated[float, Gt(0), Lt(1)], Misfit("", "a number > 0 and < 1", 0.0)),
    (0.5, Annotated[float, Gt(0), Lt(1)], None),
    ("clips", Literal["episode", "clips"], None),
    ("frames", Literal["episode", "clips"], Misfit("", '"episode" or "clips"', "frames")),
    (None, Count | None, None),
    ("x", Count | None, Misfit("", "an integer >= 1 or null", "x")),
    (["a", 2], list[str], Misfit("[1]", "a string", 2)),
    ([[1, 2], [3, "4"]], tuple[tuple[int, ...], ...], Misfit("[1][1]", "an integer", "4")),
    ([1, 2, 3], tuple[int, int], Misfit("", "a list of 2", [1, 2, 3])),
    ({"a": [1, "b"]}, dict[str, list[float]], Misfit(".a[1]", "a number", "b")),
    ({"anything": {1, 2}}, torch.device, None),   # a type configs cannot hold is not checked here
    (False, Annotated[bool, TEST_HOOK], None),
], ids=str)
def test_a_value_fits_its_annotation_or_says_where_and_what_was_expected(value, hint, found) -> None:
    assert misfit(value, hint) == found


def test_a_model_whose_annotations_cannot_be_resolved_keeps_its_names_checked_and_its_types_unchecked() -> None:
    class Opaque:
        def __init__(self, device: torch.device, size: NotImportedHere = 3, count=1, **ignored: object) -> None:  # noqa: F821
            pass

    assert declared_keywords(Opaque) is None   # **kwargs: it takes any keyword

    class Plain:
        def __init__(self, device: torch.device, size: NotImportedHere = 3, count=1) -> None:  # noqa: F821
            pass

    # Unresolvable: the integer default still stands for a count, as it did before annotations were read.
    assert [(k.name, k.hint, k.required, k.listed) for k in declared_keywords(Plain)] == [
        ("size", int, False, True), ("count", int, False, True)]


SHIPPED = [cls for module in (models.toy, models.batcher, models.aggregator, models.episode, models.r2p1d)
           for cls in vars(module).values()
           if inspect.isclass(cls) and cls.__module__ == module.__name__ and callable(getattr(cls, "output_shape", None))]


@pytest.mark.parametrize("model", SHIPPED, ids=[cls.__name__ for cls in SHIPPED])
def test_every_keyword_of_a_shipped_model_declares_its_type(model: type) -> None:
    keywords = declared_keywords(model)
    assert keywords and all(keyword.hint is not None for keyword in keywords), keywords


def test_only_the_toy_models_fail_on_purpose_switches_are_unlisted() -> None:
    unlisted = {cls.__name__: [k.name for k in declared_keywords(cls) or () if not k.listed] for cls in SHIPPED}
    assert {name: names for name, names in unlisted.items() if names} == {
        "SyntheticFrames": ["fail_at_init", "fail_at_item", "exit_at_item"],
        "TinyConvNet": ["record_pid", "fail_at_init", "fail_at_item", "exit_at_item"],
        "SegmentMerger": ["fail_at_init", "fail_at_item", "exit_at_item"]}
