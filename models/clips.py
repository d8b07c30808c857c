"""How many clips an item gets and their shape: what steps that only pass clips on need of the loaders.

Kept apart from `models.episode` so that such a step (the Batcher) imports
neither the decoder nor torchvision: every runner process pays for what its
model's module imports before the job starts.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from rnb.core.model_keywords import Count

# `num_clips` as a config gives it: a count, or {"choices": [...], "weights": [...]} (ClipCount.parse checks it).
NumClips: TypeAlias = Count | Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class ClipCount:
    """How many clips a request gets: one of `choices`, drawn with `weights`."""

    choices: tuple[int, ...]
    weights: tuple[float, ...]

    @staticmethod
    def parse(value: NumClips) -> ClipCount:
        counts: list[float]
        if isinstance(value, int) and not isinstance(value, bool):
            counts, weights = [value], [1.0]
        elif isinstance(value, Mapping) and set(value) == {"choices", "weights"}:
            counts, weights = list(value["choices"]), list(value["weights"])
        else:
            raise ValueError(f"num_clips must be a positive int or {{\"choices\": [...], \"weights\": [...]}}, got {value!r}")
        if not counts or len(counts) != len(weights):
            raise ValueError(f"num_clips: choices and weights must be non-empty lists of one length, got {value!r}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
            raise ValueError(f"num_clips: every choice must be an int >= 1, got {counts!r}")
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"num_clips: weights must be numbers >= 0 with a positive sum, got {weights!r}")
        return ClipCount(tuple(int(c) for c in counts), tuple(float(w) for w in weights))

    @property
    def maximum(self) -> int:
        return max(self.choices)

    def draw(self, rng: np.random.Generator) -> int:
        if len(self.choices) == 1:
            return self.choices[0]
        p = np.asarray(self.weights) / sum(self.weights)
        return int(self.choices[rng.choice(len(self.choices), p=p)])


def clip_shape(num_clips: NumClips, clip_length: int, size: int) -> tuple[int, ...]:
    return (ClipCount.parse(num_clips).maximum, 3, clip_length, size, size)
