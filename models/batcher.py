"""Batcher: stacks the clips of `batch` items into one input, RnB's "B".

Items may carry different clip counts; their clips are concatenated along
the first dimension and non_tensors["items"] keeps each item's own
non-tensors (its `num_clips` among them) so a later step can split them
again.  The time cards of all items travel on together as a tuple.  A partial
batch is handed over once the input has been idle for `timeout_ms` after its
first item arrived (the runner calls `flush` while idle), so the job's last
items are never stuck waiting for company.
"""
from __future__ import annotations

import time
from typing import Annotated

import torch
from annotated_types import Ge

from models.clips import NumClips, clip_shape
from rnb.core.model import NOTHING_YET, Cards, NonTensors, Shapes, StepOutput, Tensors
from rnb.core.model_keywords import Count
from rnb.core.timecard import TimeCard, one_card


class Batcher:
    """Sized by its input (the harness gives `output_shape` the previous step's output shapes).

    `num_clips`, `clip_length` and `size` are accepted for configs that still
    repeat the loader's keywords, and describe the input only without it.
    """

    def __init__(self, device: torch.device, batch: Count = 1, num_clips: NumClips = 10,
                 clip_length: Count = 8, size: Count = 112,
                 timeout_ms: Annotated[float, Ge(0)] = 50.0) -> None:
        if batch < 1 or timeout_ms < 0:
            raise ValueError(f"batch must be >= 1 and timeout_ms >= 0, got {batch} and {timeout_ms}")
        self.batch = batch
        self.timeout_s = timeout_ms / 1000
        self.pending: list[tuple[Tensors, NonTensors, TimeCard]] = []
        self.first_arrival = 0.0

    @staticmethod
    def output_shape(batch: int = 1, num_clips: NumClips = 10, clip_length: int = 8,
                     size: int = 112, input_shapes: Shapes | None = None,
                     **kwargs: object) -> Shapes:
        """`batch` inputs stacked along the first dimension; without `input_shapes`, clips of the loader's keywords."""
        if input_shapes is None:
            input_shapes = (clip_shape(num_clips, clip_length, size),)
        return tuple((batch * rows, *rest) for rows, *rest in input_shapes)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        if not self.pending:
            self.first_arrival = time.monotonic()
        # Inputs live only during the call (the runner reuses their buffers), so held items are copied.
        self.pending.append((tuple(tensor.clone() for tensor in tensors), non_tensors, card))
        if len(self.pending) < self.batch:
            return NOTHING_YET
        return self._hand_over()

    def flush(self) -> StepOutput:
        if not self.pending or time.monotonic() - self.first_arrival < self.timeout_s:
            return NOTHING_YET
        return self._hand_over()

    def _hand_over(self) -> StepOutput:
        items, self.pending = self.pending, []
        tensors = tuple(torch.cat(parts) for parts in zip(*(item[0] for item in items)))
        return StepOutput(tensors, {"items": [item[1] for item in items]}, tuple(item[2] for item in items))
