"""The two steps a profiling job puts around the step it measures: a feeder before it, a sink after it.

A step is profiled alone, yet through the harness (real runners, real slots,
real queues), so its profile holds the harness's cost of a hop as well as
the model's.  The feeder hands it inputs of exactly the shapes and dtypes its
real predecessor writes, at almost no cost of its own; the sink takes its
outputs away as fast as they come.  With every request queued at once, the
measured step is the one that sets the pace.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from rnb.core.model import Cards, NonTensors, StepOutput, Tensors
from rnb.core.timecard import Fork, TimeCard, as_cards


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"expected a torch dtype name such as 'float32', found {name!r}")
    return dtype


class Feeder:
    """Step 0 of a profiling job: one request in, the profiled step's per-item input out (zeros).

    Its non-tensors carry the request and `num_clips` (the rows of the first
    tensor), what a loader hands on and what batch-splitting steps read.
    """

    def __init__(self, device: torch.device, shapes: Sequence[Sequence[int]], dtypes: Sequence[str] = ()) -> None:
        names = tuple(dtypes) or ("float32",) * len(shapes)
        self.outputs = tuple(torch.zeros(tuple(shape), dtype=_dtype(name), device=device)
                             for shape, name in zip(shapes, names))
        self.rows = int(shapes[0][0])

    @staticmethod
    def output_shape(shapes: Sequence[Sequence[int]], **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(d) for d in shape) for shape in shapes)

    @staticmethod
    def output_dtypes(shapes: Sequence[Sequence[int]], dtypes: Sequence[str] = (), **kwargs: object) -> tuple[torch.dtype, ...]:
        return tuple(_dtype(name) for name in (tuple(dtypes) or ("float32",) * len(shapes)))

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        return StepOutput(self.outputs, {"request": non_tensors["request"], "num_clips": self.rows}, time_card)


class Sink:
    """The final step of a profiling job: counts what arrives, merging an item's segments first.

    It must merge because the runner refuses to count an unmerged segment; it
    keeps the cards only, never the tensors.
    """

    merges_segments = True

    def __init__(self, device: torch.device) -> None:
        self.pending: dict[tuple[int, tuple[Fork, ...]], list[TimeCard]] = {}   # by the item and its forks above

    @staticmethod
    def output_shape(**kwargs: object) -> None:
        return None

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        ready = []
        for card in as_cards(time_card):
            if not card.segments:
                ready.append(card)
                continue
            parts = self.pending.setdefault(card.segment_key, [])
            parts.append(card)
            if len(parts) == card.segments[-1][1]:   # the fork's count of segments
                del self.pending[card.segment_key]
                ready.append(TimeCard.merge(parts))
        return StepOutput((), {}, tuple(ready) if ready else None)
