"""A config's model keywords checked against the types and bounds the model's constructor declares.

A value that does not fit its keyword would otherwise pass validation and
fail later, far from its cause: `"batch": "4"` in output_shape() as a shape
of ('44', ...), `"classes": "ten"` in every runner as torch's TypeError.
Here it is one sentence naming the keyword's JSON path and what its
annotation takes (rnb.core.model_keywords says how a model writes one).

The checker is small and our own rather than pydantic's: a config is JSON,
so it needs no coercion (a `"4"` for an int is a mistake to report, which
pydantic's lax mode would accept) and no model classes, and its sentences
speak as every other config check does ("expected ..., found ...").
It understands what configs can hold: int, float, bool, str, None,
`Literal`, unions, `list`/`Sequence`/`tuple` (a JSON list), `dict`/
`Mapping` with str keys (a JSON object), and `Annotated` bounds.  Any other
type (a harness-supplied record such as `EpisodeRequest`, `Any`) is not
checked here.
"""
from __future__ import annotations

import collections.abc
import inspect
import operator
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

import annotated_types

from rnb.core.model_keywords import Unlisted
from rnb.core.records import Json


@dataclass(frozen=True)
class Misfit:
    """Why a value does not fit its keyword's type: where inside the value, and what was expected there."""

    where: str      # "" for the value itself, else e.g. "[2]" or ".choices[0]"
    expected: str   # "an integer >= 1"
    found: Json


@dataclass(frozen=True)
class Keyword:
    """One keyword of a model's constructor, as its signature and annotation declare it."""

    name: str
    hint: object             # the resolved annotation; None when it has none (or it cannot be resolved)
    required: bool
    listed: bool             # shown to users among the model's keywords (not a test hook)


def declared_keywords(model: type) -> tuple[Keyword, ...] | None:
    """The keywords a model's constructor takes after `device`; None when it takes any (`**kwargs`)."""
    parameters = list(inspect.signature(model).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    hints = _hints(model)
    return tuple(Keyword(p.name, _hint(p, hints), p.default is inspect.Parameter.empty,
                         not any(isinstance(m, Unlisted) for m in _metadata(hints.get(p.name))))
                 for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL)


def _hint(parameter: inspect.Parameter, hints: dict[str, object]) -> object:
    """A keyword's annotation; without one, `int` where its default is an integer (JSON's true and 1e30 are not counts)."""
    if parameter.name in hints:
        return hints[parameter.name]
    default = parameter.default
    return int if isinstance(default, int) and not isinstance(default, bool) else None


def _hints(model: type) -> dict[str, object]:
    """The constructor's resolved annotations; {} when they cannot be resolved (names known only to type checkers)."""
    constructor = next(vars(kind)["__init__"] for kind in model.__mro__ if "__init__" in vars(kind))
    try:
        return typing.get_type_hints(constructor, include_extras=True)
    except Exception:  # any failure in user code's annotations leaves its keywords unchecked, not the config refused
        return {}


def _metadata(hint: object) -> tuple[object, ...]:
    return tuple(getattr(hint, "__metadata__", ())) if typing.get_origin(hint) is typing.Annotated else ()


def misfit(value: Json, hint: object) -> Misfit | None:
    """None when `value` fits the annotation `hint`, else where and how it does not."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _annotated_misfit(value, arguments[0], _metadata(hint))
    if origin is typing.Union or origin is types.UnionType:
        return _union_misfit(value, arguments)
    if origin is typing.Literal:
        if any(type(value) is type(choice) and value == choice for choice in arguments):
            return None
        return Misfit("", " or ".join(_literal(choice) for choice in arguments), value)
    if origin in (list, tuple, collections.abc.Sequence):
        return _list_misfit(value, origin, arguments)
    if origin in (dict, collections.abc.Mapping):
        return _object_misfit(value, arguments)
    scalar = _scalar(hint)
    if scalar is None:
        return None
    fits, expected = scalar
    return None if fits(value) else Misfit("", expected, value)


_SCALARS: tuple[tuple[object, Callable[[Json], bool], str], ...] = (
    (int, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    (float, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    (bool, lambda v: isinstance(v, bool), "true or false"),
    (str, lambda v: isinstance(v, str), "a string"),
    (type(None), lambda v: v is None, "null"),
)


def _scalar(hint: object) -> tuple[Callable[[Json], bool], str] | None:
    """How to check a JSON value against a scalar type, and what to call it; None for any other type."""
    return next(((fits, name) for kind, fits, name in _SCALARS if hint is kind), None)


def _union_misfit(value: Json, members: tuple[object, ...]) -> Misfit | None:
    """A value fits a union if it fits a member; else the member of its own JSON kind says why, or all of them."""
    misfits = [misfit(value, member) for member in members]
    if any(found is None for found in misfits):
        return None
    deep = [found for found in misfits if found is not None and found.where]
    if len(deep) == 1:   # the one member of the value's kind (a list, an object) failed inside it
        return deep[0]
    return Misfit("", " or ".join(found.expected for found in misfits if found is not None), value)


def _list_misfit(value: Json, origin: object, arguments: tuple[object, ...]) -> Misfit | None:
    if not isinstance(value, list):
        return Misfit("", "a list", value)
    if origin is tuple and arguments and arguments[-1] is not Ellipsis:
        if len(value) != len(arguments):
            return Misfit("", f"a list of {len(arguments)}", value)
        items = list(zip(value, arguments))
    else:
        items = [(item, arguments[0] if arguments else object) for item in value]
    for index, (item, hint) in enumerate(items):
        found = misfit(item, hint)
        if found is not None:
            return Misfit(f"[{index}]{found.where}", found.expected, found.found)
    return None


def _object_misfit(value: Json, arguments: tuple[object, ...]) -> Misfit | None:
    if not isinstance(value, dict):
        return Misfit("", "an object", value)
    hint = arguments[1] if len(arguments) == 2 else object
    for key, item in value.items():
        found = misfit(item, hint)
        if found is not None:
            return Misfit(f".{key}{found.where}", found.expected, found.found)
    return None


def _annotated_misfit(value: Json, base: object, metadata: tuple[object, ...]) -> Misfit | None:
    """A value of the wrong type, or a number out of the bounds the annotation carries; either says both."""
    bounds: list[object] = []
    for item in metadata:
        # Interval(ge=1, le=5) is a group: Ge(1) and Le(5).
        bounds.extend(item if isinstance(item, annotated_types.GroupedMetadata) else [item])
    limits = [limit for limit in map(_limit, bounds) if limit is not None]
    wrong = misfit(value, base)
    if wrong is not None and (wrong.where or not limits):
        return wrong
    if wrong is None and (not isinstance(value, (int, float)) or all(_COMPARE[name](value, at) for name, at in limits)):
        return None
    scalar = _scalar(base)
    kind = scalar[1] if scalar is not None else "a number"
    if [name for name, _ in limits] == [">=", "<="]:
        return Misfit("", f"{kind} from {limits[0][1]} to {limits[1][1]}", value)
    return Misfit("", f"{kind} " + " and ".join(f"{name} {at}" for name, at in limits), value)


def _limit(bound: object) -> tuple[str, float] | None:
    """An annotated_types bound as (comparison, limit); None for metadata of any other kind."""
    if isinstance(bound, annotated_types.Ge):
        return ">=", typing.cast(float, bound.ge)
    if isinstance(bound, annotated_types.Gt):
        return ">", typing.cast(float, bound.gt)
    if isinstance(bound, annotated_types.Le):
        return "<=", typing.cast(float, bound.le)
    if isinstance(bound, annotated_types.Lt):
        return "<", typing.cast(float, bound.lt)
    return None


_COMPARE: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, ">": operator.gt, "<=": operator.le,
                                                       "<": operator.lt}


def _literal(choice: object) -> str:
    return f'"{choice}"' if isinstance(choice, str) else repr(choice)
