"""Output-queue selection policies: which of a group's out_queues gets an item.

A config names a policy by dotted class path (`queue_selector`); the class is
built once per runner as `cls(num_queues, **queue_selector_kwargs)` and asked
once per output.  Constructors take only the keywords they use, so a
misspelt keyword in a config is caught before the job starts.
"""
from __future__ import annotations

from rnb.core.model import NonTensors, SelectorClass, Tensors
from rnb.core.timecard import Cards


class RoundRobinSelector:
    """Spread outputs evenly, in turn; the default when a group names none."""

    def __init__(self, num_queues: int) -> None:
        if num_queues < 1:
            raise ValueError(f"RoundRobinSelector needs at least one output queue, got {num_queues}")
        self.num_queues = num_queues
        self._next = 0

    def select(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> int:
        chosen = self._next
        self._next = (self._next + 1) % self.num_queues
        return chosen


class LargeSmallSelector:
    """Queue 1 for items with more than `threshold` clips, queue 0 for the rest (RnB's large/small split).

    Large items then get their own batcher and network group, so they do not
    hold back small ones.  Set the threshold from a config with
    "queue_selector_kwargs": {"threshold": 6}.  The clip count is the item's `num_clips`
    non-tensor (set by the episode loaders), else the first tensor's rows.
    """

    def __init__(self, num_queues: int, threshold: int = 4) -> None:
        if num_queues != 2:
            raise ValueError(f"LargeSmallSelector needs exactly two output queues (small, large), got {num_queues}")
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(f"LargeSmallSelector's threshold must be an int >= 0 (clips), got {threshold!r}")
        self.threshold = threshold

    def select(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> int:
        clips = non_tensors.get("num_clips", tensors[0].shape[0] if tensors else 0)
        return int(clips > self.threshold)


# Held to rnb.core.model's selector contract where mypy reads it (the runner loads a selector by dotted path).
SELECTOR_CLASSES: tuple[SelectorClass, ...] = (RoundRobinSelector, LargeSmallSelector)
