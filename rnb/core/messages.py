"""Every message that crosses a process boundary, each a named frozen record.

    client ──Request──▶ step 0 ──Signal──▶ step 1 ... final step ──Results──▶ main
    every child ──Ready, then Failed (if it raised), then Exited──▶ main

They are small and pickle cheaply: tensors never travel in a message (a
Signal only says which shared slot holds them).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rnb.core.model import NonTensors
from rnb.core.timecard import Cards, TimeCard


@dataclass(frozen=True)
class Request:
    """Client -> step 0: one request of the source, and the item's new time card."""

    payload: object   # whatever the source yields; step 0's model receives it as non_tensors["request"]
    card: TimeCard

    def __reduce__(self) -> tuple[Callable[..., Request], tuple[object, ...]]:
        return Request, (self.payload, self.card)   # as Signal's: once per item


@dataclass(frozen=True)
class Signal:
    """Step k -> step k+1: which producer's slot holds the tensors, plus the small rest."""

    step: int
    group: int
    instance: int
    slot: int
    non_tensors: NonTensors
    time_card: Cards

    def __reduce__(self) -> tuple[Callable[..., Signal], tuple[object, ...]]:
        # Rebuilt by its constructor from a flat tuple: half the unpickling time of a dataclass's state dict,
        # paid at every hop.
        return Signal, (self.step, self.group, self.instance, self.slot, self.non_tensors, self.time_card)


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
    intra_op_threads: int
    interop_threads: int
    # NVML's view of the process on its GPU, in all and outside torch's allocator (its CUDA context and
    # library handles); None without a CUDA device or where NVML cannot tell (rnb.pipeline.gpus)
    device_process_bytes: int | None = None
    device_outside_allocator_bytes: int | None = None


@dataclass(frozen=True)
class Results:
    """Final step -> main: time cards of finished items, counted towards the target."""

    cards: tuple[TimeCard, ...]


Status = Ready | Failed | Exited
