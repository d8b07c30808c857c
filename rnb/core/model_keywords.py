"""What a model's constructor declares about its keywords beyond their types, in its own annotations.

A constructor's annotations are the one place a model says what each
keyword takes, and the harness checks a config's values against them before
anything starts (rnb.pipeline.keyword_check): the type, and the bounds an
`Annotated` type carries, written with annotated_types' `Ge`, `Gt`, `Le`,
`Lt` and `Interval`, the vocabulary pydantic and other checkers read too:

    def __init__(self, device: torch.device, batch: Annotated[int, Ge(1)] = 1,
                 fail_at_init: Annotated[bool, TEST_HOOK] = False) -> None:

`Count` (an integer >= 1: a size, a number of things) and `Natural` (an
integer >= 0: a seed, an index) are the bounds most keywords take.
`TEST_HOOK` marks a keyword that exists so that tests can make a model fail
on purpose: it is checked like any other, but a user is never offered it.
A model whose keywords are wrong only against its data says so with
`KeywordError` (the ChecksDataset hook of rnb.core.model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypeAlias

from annotated_types import Ge


@dataclass(frozen=True)
class Unlisted:
    """A keyword left out of the list of a model's keywords shown to users, and why."""

    why: str


TEST_HOOK = Unlisted("a switch for tests, to make the model fail or record on purpose")


Count: TypeAlias = Annotated[int, Ge(1)]
Natural: TypeAlias = Annotated[int, Ge(0)]


class KeywordError(ValueError):
    """A model's complaint about one of its keywords (a `check_dataset` hook raises it); plan adds the JSON path."""

    def __init__(self, keyword: str, expected: str) -> None:
        self.keyword = keyword      # e.g. "camera", "tabular[1]"
        self.expected = expected    # "expected ..., found ...", as ConfigError words it
        super().__init__(f"{keyword}: {expected}")
