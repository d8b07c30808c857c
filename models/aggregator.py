"""Aggregator: the step that turns per-clip logits into one prediction per item.

An item may arrive whole, as segments (a step before split it with
num_segments; they are held until all have arrived and merged in order), or
inside a batch (a tuple of time cards; non_tensors["items"] gives each
item's clip count).  Clip logits are summed and the argmax is the item's
prediction, set on its time card as the field `prediction`.
"""
from __future__ import annotations

import torch

from rnb.core.model import Cards, NonTensors, Shapes, StepOutput, Tensors
from rnb.core.model_keywords import Count
from rnb.core.timecard import SegmentKey, TimeCard


class Aggregator:
    """Usually the final step; as an inner step it outputs (items, num_classes) summed logits.

    Sized by its input (clips, num_classes): every item has at least one clip,
    so there are never more items than input rows.  `num_classes` and `batch`
    describe the output only when no input shape is given.
    """

    merges_segments = True  # config validation lets a step before this one split items (num_segments > 1)

    def __init__(self, device: torch.device, num_classes: Count = 400, batch: Count = 1) -> None:
        self.pending: dict[SegmentKey, list[tuple[TimeCard, torch.Tensor]]] = {}

    @staticmethod
    def output_shape(num_classes: int = 400, batch: int = 1, input_shapes: Shapes | None = None,
                     **kwargs: object) -> Shapes:
        if input_shapes is None:
            return ((batch, num_classes),)
        (rows, *classes), *rest = input_shapes
        if rest or len(classes) != 1:
            raise ValueError(f"Aggregator takes one tensor of (clips, num_classes) logits, but the previous step "
                             f"outputs {input_shapes}")
        return ((rows, classes[0]),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        logits = tensors[0]
        if not isinstance(time_card, TimeCard):
            counts = [item["num_clips"] for item in non_tensors["items"]]
            if sum(counts) != logits.shape[0]:
                raise ValueError(f"items {[c.item_id for c in time_card]}: the batch has {logits.shape[0]} rows of "
                                 f"logits but its items have {sum(counts)} clips")
            sums = torch.stack([part.sum(0) for part in torch.split(logits, counts)])
            return self._predict(sums, non_tensors, tuple(time_card))
        if time_card.segments:
            parts = self.pending.setdefault(time_card.segment_key, [])
            parts.append((time_card, logits.clone()))  # inputs live only during the call
            if len(parts) < time_card.segments[-1][1]:
                return StepOutput((), non_tensors, None)
            del self.pending[time_card.segment_key]
            parts.sort(key=lambda part: part[0].segments[-1][0])
            logits = torch.cat([part for _, part in parts])
            time_card = TimeCard.merge(card for card, _ in parts)
        sums = logits.sum(0, keepdim=True)
        out, non_tensors, _ = self._predict(sums, non_tensors, (time_card,))
        return StepOutput(out, non_tensors, time_card)

    @staticmethod
    def _predict(sums: torch.Tensor, non_tensors: NonTensors, cards: tuple[TimeCard, ...]) -> StepOutput:
        predictions = sums.argmax(1).tolist()
        for card, prediction in zip(cards, predictions):
            card.set_field("prediction", prediction)
        return StepOutput((sums,), {**non_tensors, "predictions": predictions}, cards)
