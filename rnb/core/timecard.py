"""Per-item time cards: the only record of where an item spent its time and which way it went.

A card travels with its item through every queue, collects epoch-second
events and the route of each step (device, replica, batch, output queue),
and ends up as one row of timings.parquet.  A batch travels as a tuple of
cards so the final step can count every item in it; a segmented item travels
as forked cards that an aggregator merges back into one.

A card crosses a process boundary at every hop, so its form is what each hop
pays to pickle: the harness's own events and route sit in two flat lists at
fixed positions (a name costs nothing on the wire), and only what models
add (their own events and fields) travels by name.
"""
from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TypeAlias, TypeVar

from rnb.core.stages import ENQUEUE, StepEvents

# A card's times hold the enqueue at entry 0, then the events the harness stamps at step k (in the order they
# happen: arrived, started, finished, slot acquired, handed over) at entries 1 + 5k to 5 + 5k.
# How far this process's clock runs ahead of the job's (the driver's); 0 except on other Ray nodes.
_clock_offset_s = 0.0


def set_clock_offset(offset_s: float) -> None:
    """Stamp this process's cards on the driver's clock from now on, given how far this clock runs ahead of it.

    The Ray engine measures each node's offset before the start and sets it
    in every actor, so a card's events, stamped on several hosts, compare.
    """
    global _clock_offset_s
    _clock_offset_s = offset_s


def now() -> float:
    """Epoch seconds on the job's clock: what time cards are stamped with."""
    return time.time() - _clock_offset_s


_PER_STEP = 5
_ARRIVED, _STARTED = 0, 1
# What the harness knows of the way an item took through step k, at entry 6k + j of a card's route.
# The output queue comes last: it is chosen per segment, after the step's output has been forked.
ROUTE_COLUMNS = ("device{k}", "group{k}", "instance{k}", "batch{k}", "batch_size{k}", "out_queue{k}")
_DEVICE, _GROUP, _INSTANCE, _BATCH, _BATCH_SIZE, _OUT_QUEUE = range(len(ROUTE_COLUMNS))
_STEP_NAME = re.compile(r"^([a-z_]+?)(\d+)(_[a-z]+)?$")
# One route entry: the device's name, or a queue group, replica, batch, batch size or output queue number.
RouteEntry: TypeAlias = str | int
# What a model sets on a card (rnb.core.joblog makes each a nullable column): counts, measures, names.
FieldValue: TypeAlias = str | int | float
# A card's lists by position (its times, its route), None where nothing is recorded.
Entry = TypeVar("Entry", float | None, RouteEntry | None)


@functools.cache
def _step_layout(step: int) -> tuple[str, ...]:
    events = StepEvents(step)
    return events.arrived, events.started, events.finished, events.slot_acquired, events.handed_over


@functools.cache
def event_index(name: str) -> int | None:
    """Where a harness event lives in a card's times; None for any other name (a model's own event)."""
    if name == ENQUEUE:
        return 0
    match = _STEP_NAME.match(name)
    step = int(match.group(2)) if match else -1
    layout = _step_layout(step) if step >= 0 else ()
    return 1 + _PER_STEP * step + layout.index(name) if name in layout else None


def event_name(index: int) -> str:
    return ENQUEUE if index == 0 else _step_layout((index - 1) // _PER_STEP)[(index - 1) % _PER_STEP]


def route_name(index: int) -> str:
    return ROUTE_COLUMNS[index % len(ROUTE_COLUMNS)].format(k=index // len(ROUTE_COLUMNS))


@functools.cache
def _route_index(name: str) -> int:
    match = _STEP_NAME.match(name)
    if match:
        template = f"{match.group(1)}{{k}}{match.group(3) or ''}"
        if template in ROUTE_COLUMNS:
            return len(ROUTE_COLUMNS) * int(match.group(2)) + ROUTE_COLUMNS.index(template)
    raise KeyError(f"{name!r} is not a route column; expected one of {', '.join(ROUTE_COLUMNS)}")


class Fork(NamedTuple):
    """One split of an item into segments, as each segment's card remembers it."""

    number: int       # which segment this card is, from 0
    total: int        # how many segments the item was split into
    times: int        # entries of the card's times recorded before the split: later ones are this segment's own
    route: int        # the same for its route


# What the segments of one fork share (TimeCard.segment_key): the item and the forks above this one.
SegmentKey: TypeAlias = tuple[int, tuple[Fork, ...]]


def _put(values: list[Entry], index: int, value: Entry) -> None:
    if index < len(values):
        values[index] = value
    else:  # usually index == len(values): events and route entries come in order
        values.extend([None] * (index - len(values)))
        values.append(value)


class TimeCard:
    """Events, route and model-set fields of one item (or one segment of it)."""

    __slots__ = ("item_id", "payload", "times", "route", "marks", "fields", "segments", "per_segment")

    def __init__(self, item_id: int, payload: str = "") -> None:
        self.item_id = item_id
        self.payload = payload
        self.times: list[float | None] = []    # harness events by position (event_index); None = not recorded
        self.route: list[RouteEntry | None] = []  # ROUTE_COLUMNS by position 6k + j; None = not recorded
        self.marks: dict[str, float] = {}      # every other event, by name: models' own, siblings{k}_arrived
        self.fields: dict[str, FieldValue] = {}
        self.segments: tuple[Fork, ...] = ()   # the forks still waiting to be merged, outermost first
        # after a merge: each segment's own events and route, by column
        self.per_segment: dict[str, float | RouteEntry] = {}

    def __reduce__(self) -> tuple[Callable[..., TimeCard], tuple[object, ...]]:
        # A plain function and tuple: the cheapest form pickle knows, paid at every hop.
        return _card, (self.item_id, self.payload, self.times, self.route, self.marks or None,
                       self.fields or None, tuple(tuple(fork) for fork in self.segments), self.per_segment or None)

    def __repr__(self) -> str:
        return f"TimeCard(item_id={self.item_id}, segments={self.segments}, events={sorted(self.events)})"

    def record(self, name: str, when: float | None = None) -> None:
        when = now() if when is None else when
        index = event_index(name)
        if index is None:
            self.marks[name] = when
        else:
            _put(self.times, index, when)

    def event(self, name: str) -> float | None:
        index = event_index(name)
        if index is None:
            return self.marks.get(name)
        return self.times[index] if index < len(self.times) else None

    @property
    def events(self) -> dict[str, float]:
        """Every recorded event by name: the harness's in the order they happen, then the rest."""
        recorded = {event_name(i): when for i, when in enumerate(self.times) if when is not None}
        return {**recorded, **self.marks}

    def set_device(self, step: int, device: str) -> None:
        _put(self.route, len(ROUTE_COLUMNS) * step + _DEVICE, device)

    def set_replica(self, step: int, group: int, instance: int) -> None:
        """The runner of step `step` that took the item: its queue group and its index in the group."""
        _put(self.route, len(ROUTE_COLUMNS) * step + _GROUP, group)
        _put(self.route, len(ROUTE_COLUMNS) * step + _INSTANCE, instance)

    def set_batch(self, step: int, batch: int, size: int) -> None:
        """The output of step `step` the item left in: its number on that runner and how many items it held."""
        _put(self.route, len(ROUTE_COLUMNS) * step + _BATCH, batch)
        _put(self.route, len(ROUTE_COLUMNS) * step + _BATCH_SIZE, size)

    def set_out_queue(self, step: int, queue: int) -> None:
        """The output queue of step `step` (its number in the config) the item was put on."""
        _put(self.route, len(ROUTE_COLUMNS) * step + _OUT_QUEUE, queue)

    def route_entry(self, name: str) -> RouteEntry | None:
        """A route column's value for this item, e.g. route_entry("group1"); None if not recorded."""
        index = _route_index(name)
        return self.route[index] if index < len(self.route) else None

    @property
    def devices(self) -> dict[int, str]:
        return {i // len(ROUTE_COLUMNS): device for i, device in enumerate(self.route)
                if i % len(ROUTE_COLUMNS) == _DEVICE and isinstance(device, str)}

    def set_field(self, name: str, value: FieldValue) -> None:
        self.fields[name] = value

    def fork(self, n: int) -> list[TimeCard]:
        """Split into n segment cards, each remembering what it holds from before the split."""
        if n < 1:
            raise ValueError(f"a time card can only be forked into 1 or more segments, not {n}")
        parts = []
        for index in range(n):
            part = TimeCard(self.item_id, self.payload)
            part.times, part.route, part.marks = list(self.times), list(self.route), dict(self.marks)
            # Fields and earlier segments' records go with segment 0 only: a merge sums fields and
            # unites records, so each is counted once and travels once.
            part.fields = dict(self.fields) if index == 0 else {}
            part.per_segment = dict(self.per_segment) if index == 0 else {}
            part.segments = self.segments + (Fork(index, n, len(self.times), len(self.route)),)
            parts.append(part)
        return parts

    @property
    def segment_key(self) -> SegmentKey:
        """What the segments of one fork share: the item and the forks above this one."""
        return self.item_id, self.segments[:-1]

    @staticmethod
    def merge(parts: Iterable[TimeCard]) -> TimeCard:
        """Undo the innermost fork: one card for the item, and each segment's own record kept by column.

        The merged card follows one segment, the first to reach the merging
        step, so its events stay in order and its stage times add up: after
        that segment arrived the item waited for its siblings until the last
        one arrived (siblings{k}_arrived), and the model's call that merged
        them (the last segment's) is the step's inference.  Every event and
        route entry a segment recorded after the fork is kept as
        seg{i}_<column> (seg{i}-{j}_<column> for nested forks); a step that
        segments ran on several devices lists them joined by '+'.  Numeric
        fields are summed; string fields that differ are joined with '+'.
        """
        parts = sorted(parts, key=lambda card: card.segments[-1].number if card.segments else 0)
        if not parts or not parts[0].segments:
            raise ValueError("merge needs the segment cards of one forked item")
        key, fork = parts[0].segment_key, parts[0].segments[-1]
        numbered = [p.segments[-1][:2] for p in parts]
        if any(p.segment_key != key for p in parts) or numbered != [(i, fork.total) for i in range(fork.total)]:
            raise ValueError(f"item {parts[0].item_id}: merge needs exactly segments 0..{fork.total - 1} of one fork")
        step = _merging_step(parts, fork)
        if step is None:
            first = last = parts[0]
        else:
            arrival = 1 + _PER_STEP * step + _ARRIVED
            first = min(parts, key=lambda part: _arrived(part, arrival))
            last = max(parts, key=lambda part: _arrived(part, arrival))
        merged = TimeCard(first.item_id, first.payload)
        merged.segments = key[1]
        merged.times = list(first.times)
        merged.route = list(first.route)
        merged.marks = dict(first.marks)
        if step is not None and last is not first:
            merged.marks[StepEvents(step).siblings_arrived] = _arrived(last, arrival)
            _put(merged.times, arrival + _STARTED, last.times[arrival + _STARTED])
        shared_marks = _shared_marks(parts)
        for part in parts:
            merged.per_segment.update(part.per_segment)
            merged.per_segment.update(_own_record(part, fork, shared_marks))
            _join_devices(merged, part, fork)
            _merge_fields(merged.fields, part.fields)
        return merged


def _card(item_id: int, payload: str, times: list[float | None], route: list[RouteEntry | None],
          marks: dict[str, float] | None, fields: dict[str, FieldValue] | None,
          segments: tuple[tuple[int, int, int, int], ...], per_segment: dict[str, float | RouteEntry] | None) -> TimeCard:
    card = TimeCard.__new__(TimeCard)
    card.item_id, card.payload, card.times, card.route = item_id, payload, times, route
    card.marks, card.fields = marks or {}, fields or {}
    card.segments = tuple(map(Fork._make, segments)) if segments else ()
    card.per_segment = per_segment or {}
    return card


def _merging_step(parts: list[TimeCard], fork: Fork) -> int | None:
    """The step that merges the segments: the last one every segment has arrived at since the fork."""
    arrived = [i for i in range(1, min(len(p.times) for p in parts), _PER_STEP)
               if i >= fork.times and all(p.times[i] is not None for p in parts)]
    return (arrived[-1] - 1) // _PER_STEP if arrived else None


def _arrived(part: TimeCard, index: int) -> float:
    """When a segment arrived at the merging step, which every segment has (_merging_step)."""
    when = part.times[index]
    assert when is not None
    return when


def _own_record(part: TimeCard, fork: Fork, shared_marks: set[str]) -> dict[str, float | RouteEntry]:
    """What a segment recorded after the fork, under its own column names."""
    prefix = "seg" + "-".join(str(f.number) for f in part.segments) + "_"
    own: dict[str, float | RouteEntry] = {prefix + event_name(i): when for i, when in enumerate(part.times)
                                          if i >= fork.times and when is not None}
    own.update((prefix + route_name(i), value) for i, value in enumerate(part.route)
               if i >= fork.route and value is not None)
    own.update((prefix + name, when) for name, when in part.marks.items() if name not in shared_marks)
    return own


def _shared_marks(parts: list[TimeCard]) -> set[str]:
    """Marks (events by name) every segment holds alike: the ones the fork copied from the item."""
    first, *others = parts
    return {name for name, when in first.marks.items() if all(p.marks.get(name) == when for p in others)}


def _join_devices(merged: TimeCard, part: TimeCard, fork: Fork) -> None:
    for i in range(_DEVICE, len(part.route), len(ROUTE_COLUMNS)):
        device = part.route[i]
        if i < fork.route or not isinstance(device, str):
            continue
        seen = merged.route[i] if i < len(merged.route) else None
        if not isinstance(seen, str):
            _put(merged.route, i, device)
        elif device not in seen.split("+"):
            merged.route[i] = "+".join(sorted(seen.split("+") + [device]))


def _merge_fields(merged: dict[str, FieldValue], fields: dict[str, FieldValue]) -> None:
    for name, value in fields.items():
        old = merged.get(name)
        if old is None:
            merged[name] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(old, (int, float)):
            merged[name] = old + value
        elif isinstance(value, str) and isinstance(old, str) and value not in old.split("+"):
            merged[name] = "+".join(sorted(old.split("+") + [value]))


def as_cards(time_card: TimeCard | Sequence[TimeCard]) -> tuple[TimeCard, ...]:
    """A model may return one card or a batch of them; the harness handles both alike."""
    if isinstance(time_card, TimeCard):
        return (time_card,)
    cards = tuple(time_card)
    if not all(isinstance(card, TimeCard) for card in cards):
        raise TypeError(f"a model returned a time card of type {type(time_card).__name__}; "
                        "expected TimeCard or a sequence of them")
    return cards


# One item's card, or a batch's cards (a Batcher's output): what travels with a step's output.
Cards: TypeAlias = TimeCard | tuple[TimeCard, ...]


def one_card(time_card: Cards, model: str) -> TimeCard:
    """The card of a model that takes one item per call; a batch reaches it only from a batching step before it."""
    if isinstance(time_card, TimeCard):
        return time_card
    raise TypeError(f"{model} takes one item per call, found a batch of {len(time_card)} (items "
                    f"{', '.join(str(card.item_id) for card in time_card)}): a step after a batching one needs a model "
                    "that takes batches")
