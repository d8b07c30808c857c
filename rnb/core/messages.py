"""Every message that crosses a process boundary, each a named frozen record.

    client ──Request──▶ step 0 ──Signal──▶ step 1 ... final step ──Results──▶ main
    every child ──Ready, then Failed (if it raised), then Exited──▶ main; the client Offered before its Exited

They are small and pickle cheaply: tensors never travel in a message (a
Signal only says which shared slot holds them).  The two sent once per item
and hop, Request and Signal, also have a wire form (`wire`, `from_wire`): a
flat tuple of plain values, which pickles in a third of the time of the
record itself, since pickle names no class in it (naming a class costs a
module lookup on each side of every hop).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rnb.core.timecard import Cards, TimeCard

if TYPE_CHECKING:   # a message needs nothing of the model contract to be read (Ray's JobControl imports neither)
    from rnb.core.model import NonTensors

# TimeCard's own rebuild from the flat state it pickles as (its __reduce__): a card's wire form is that state.
_REBUILD_CARD: Callable[..., TimeCard] = TimeCard(0).__reduce__()[0]
# A Signal's or Request's wire form: plain values only, the card (or a batch's cards) as TimeCard's state.
Wire = tuple[Any, ...]


def _cards_wire(cards: Cards) -> tuple[Any, Any]:
    """(one card's state, None) or (None, a batch's states)."""
    if isinstance(cards, TimeCard):
        return cards.__reduce__()[1], None
    return None, tuple(card.__reduce__()[1] for card in cards)


def _cards_from_wire(one: Any, batch: Any) -> Cards:
    if batch is None:
        return _REBUILD_CARD(*one)
    return tuple(_REBUILD_CARD(*state) for state in batch)


@dataclass(frozen=True)
class Request:
    """Client -> step 0: one request of the source, and the item's new time card."""

    payload: object   # whatever the source yields; step 0's model receives it as non_tensors["request"]
    card: TimeCard

    def __reduce__(self) -> tuple[Callable[..., Request], tuple[object, ...]]:
        return Request, (self.payload, self.card)   # a flat tuple, not a state dict: once per item (Ray's hop)

    def wire(self) -> Wire:
        return self.payload, self.card.__reduce__()[1]

    @staticmethod
    def from_wire(wire: Wire) -> Request:
        payload, card = wire
        return Request(payload, _REBUILD_CARD(*card))


@dataclass(frozen=True)
class Signal:
    """Step k -> step k+1: which producer's slot holds the tensors, plus the small rest."""

    step: int
    group: int
    instance: int
    slot: int
    non_tensors: NonTensors
    time_card: Cards

    def wire(self) -> Wire:
        return (self.step, self.group, self.instance, self.slot, self.non_tensors, *_cards_wire(self.time_card))

    @staticmethod
    def from_wire(wire: Wire) -> Signal:
        step, group, instance, slot, non_tensors, one, batch = wire
        return Signal(step, group, instance, slot, non_tensors, _cards_from_wire(one, batch))


@dataclass(frozen=True)
class Handoff:
    """Step k -> step k+1 on the Ray engine: the small rest, while the tensors travel beside it through Ray."""

    step: int
    group: int
    instance: int
    non_tensors: NonTensors
    time_card: Cards


@dataclass(frozen=True)
class Ready:
    """A child is set up (model loaded, source open) and waits at the start barrier."""

    name: str
    notes: tuple[str, ...] = ()  # lines for meta.json's notes, e.g. which weights a network runs with


@dataclass(frozen=True)
class Failed:
    """A child raised: its error as one line."""

    name: str
    error: str


@dataclass(frozen=True)
class Exited:
    """A child's last words, whether it succeeded or failed: what it used."""

    name: str
    peak_rss_bytes: int
    peak_device_bytes: int | None   # None for a process that used no CUDA device
    intra_op_threads: int | None    # torch's thread counts; None for a process that never loaded torch (Ray's client)
    interop_threads: int | None
    # NVML's view of the process on its GPU, in all and outside torch's allocator (its CUDA context and
    # library handles); None without a CUDA device or where NVML cannot tell (rnb.pipeline.gpus)
    device_process_bytes: int | None = None
    device_outside_allocator_bytes: int | None = None


@dataclass(frozen=True)
class Offered:
    """Client -> main, once as it ends: what it offered, so that the log keeps every request, dropped ones too.

    The requests are the first `issued` arrivals of the job's load (rnb.load:
    their due times, streams and frames follow from the settings and the
    seed), item k the k-th; `dropped` are those a newer frame of their stream
    replaced under the drop policy.
    """

    name: str
    started: float                 # the client's start, epoch seconds on the job's clock: a due time's zero
    issued: int
    dropped: tuple[int, ...] = ()  # item ids


@dataclass(frozen=True)
class Results:
    """Final step -> main: time cards of finished items, counted towards the target."""

    cards: tuple[TimeCard, ...]


Status = Ready | Failed | Exited | Offered
