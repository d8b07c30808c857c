"""Per-item time cards: the only record of where an item spent its time.

A card travels with its item through every queue (it is small and pickles
cheaply), collects epoch-second events and the device of each step, and ends
up as one row of timings.parquet.  A batch travels as a tuple of cards so the
final step can count every item in it; a segmented item travels as forked
cards that an aggregator merges back into one.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Sequence


class TimeCard:
    """Events, devices and model-set fields of one item (or one segment of it)."""

    __slots__ = ("item_id", "payload", "events", "devices", "fields", "segments")

    def __init__(self, item_id: int, payload: str = "") -> None:
        self.item_id = item_id
        self.payload = payload
        self.events: dict[str, float] = {}
        self.devices: dict[int, str] = {}
        self.fields: dict[str, Any] = {}
        # One (index, count) pair per fork still waiting to be merged, outermost first.
        self.segments: tuple[tuple[int, int], ...] = ()

    def __getstate__(self) -> tuple:
        return (self.item_id, self.payload, self.events, self.devices, self.fields, self.segments)

    def __setstate__(self, state: tuple) -> None:
        self.item_id, self.payload, self.events, self.devices, self.fields, self.segments = state

    def __repr__(self) -> str:
        return f"TimeCard(item_id={self.item_id}, segments={self.segments}, events={sorted(self.events)})"

    def record(self, name: str, when: float | None = None) -> None:
        self.events[name] = time.time() if when is None else when

    def set_device(self, step: int, device: str) -> None:
        self.devices[step] = device

    def set_field(self, name: str, value: Any) -> None:
        self.fields[name] = value

    def fork(self, n: int) -> list[TimeCard]:
        """Split into n segment cards.

        Fields already set stay with segment 0 only, so that a merge which sums
        numeric fields (bytes, frames) counts them once.
        """
        if n < 1:
            raise ValueError(f"a time card can only be forked into 1 or more segments, not {n}")
        parts = []
        for index in range(n):
            part = TimeCard(self.item_id, self.payload)
            part.events = dict(self.events)
            part.devices = dict(self.devices)
            part.fields = dict(self.fields) if index == 0 else {}
            part.segments = self.segments + ((index, n),)
            parts.append(part)
        return parts

    @property
    def segment_key(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """What the segments of one fork share: the item and the forks above this one."""
        return self.item_id, self.segments[:-1]

    @staticmethod
    def merge(parts: Iterable[TimeCard]) -> TimeCard:
        """Undo the innermost fork: one card whose events span all segments.

        A start event keeps its earliest value and any other event its latest
        (the item is done when its last segment is); numeric fields are summed;
        devices and string fields that differ between segments are joined with '+'.
        """
        parts = sorted(parts, key=lambda card: card.segments[-1][0] if card.segments else 0)
        if not parts or not parts[0].segments:
            raise ValueError("merge needs the segment cards of one forked item")
        key, count = parts[0].segment_key, parts[0].segments[-1][1]
        if any(p.segment_key != key for p in parts) or [p.segments[-1] for p in parts] != [(i, count) for i in range(count)]:
            raise ValueError(f"item {parts[0].item_id}: merge needs exactly segments 0..{count - 1} of one fork")
        merged = TimeCard(parts[0].item_id, parts[0].payload)
        merged.segments = key[1]
        for part in parts:
            for name, when in part.events.items():
                old = merged.events.get(name)
                earliest = name == "enqueue" or name.endswith("_start")
                if old is None or (when < old if earliest else when > old):
                    merged.events[name] = when
            for step, device in part.devices.items():
                seen = merged.devices.get(step)
                if seen is None:
                    merged.devices[step] = device
                elif device not in seen.split("+"):
                    merged.devices[step] = "+".join(sorted(seen.split("+") + [device]))
            for name, value in part.fields.items():
                old = merged.fields.get(name)
                summable = isinstance(value, (int, float)) and not isinstance(value, bool)
                if old is None:
                    merged.fields[name] = value
                elif summable and isinstance(old, (int, float)):
                    merged.fields[name] = old + value
                elif isinstance(value, str) and isinstance(old, str) and value not in old.split("+"):
                    merged.fields[name] = "+".join(sorted(old.split("+") + [value]))
        return merged


def as_cards(time_card: TimeCard | Sequence[TimeCard]) -> tuple[TimeCard, ...]:
    """A model may return one card or a batch of them; the harness handles both alike."""
    if isinstance(time_card, TimeCard):
        return (time_card,)
    cards = tuple(time_card)
    if not all(isinstance(card, TimeCard) for card in cards):
        raise TypeError(f"a model returned a time card of type {type(time_card).__name__}; expected TimeCard or a sequence of them")
    return cards
