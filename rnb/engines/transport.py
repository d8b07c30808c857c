"""The seam between the engine-independent loops (runner, client) and an engine.

The runner loop (`rnb.engines.runner`) decides what happens to an item:
time-card stamps, the model call, segments, the selector, batcher flushes,
final-step checks.  How an input reaches a step, how outputs reach the next
one, how the start barrier, the termination flag and the job's results are
shared: that is the engine's, behind these two small protocols.  The local
engine implements them in `rnb.engines.local.transport` (shared slots and
torch.multiprocessing queues); another engine implements the same methods.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rnb.core.messages import Request, Results, Status
from rnb.core.termination import Termination
from rnb.core.timecard import TimeCard

# The final step sends counted cards to whoever counts the job in batches of up to this many: one
# message per item would cost both sides as much as a hop.
RESULTS_BATCH = 64


class FinishedCards:
    """The final step's counted cards not yet sent to the job's counter (main, or Ray's JobControl).

    When a batch goes is each engine's policy; holding, timing and sending
    the batch is the same for both.
    """

    def __init__(self, send: Callable[[Results], Any]) -> None:
        self._send = send
        self._cards: list[TimeCard] = []
        self.oldest = 0.0  # when the first card held now was added (time.monotonic)

    def __len__(self) -> int:
        return len(self._cards)

    def add(self, cards: tuple[TimeCard, ...]) -> None:
        if cards and not self._cards:
            self.oldest = time.monotonic()
        self._cards.extend(cards)

    def send(self) -> None:
        """Send what is held, if anything, as one Results."""
        if self._cards:
            self._send(Results(tuple(self._cards)))
            self._cards = []


@dataclass(frozen=True)
class Input:
    """One input of a step, already the runner's own: the producer may reuse what it came from."""

    tensors: tuple[torch.Tensor, ...]   # () for step 0, whose input is a request
    non_tensors: dict                   # {"request": payload} for step 0
    time_card: Any                      # TimeCard or a tuple of them (a batch)
    arrived: float                      # epoch seconds when it was taken off the input, before any copy


class Participant(Protocol):
    """What every process of a job (client or runner) shares with its engine: the flag, the barrier, reports.

    No method blocks longer than a poll interval past the job's end.
    """

    @property
    def stopped(self) -> bool:
        """True once the job is over, for whatever reason."""

    def stop(self, reason: Termination) -> None:
        """End the job for everyone; the first reason given (by anyone) is the one recorded."""

    def report(self, status: Status) -> None:
        """Tell the main process how this process is doing (Ready, Failed, Exited)."""

    def wait_for_start(self) -> bool:
        """Block at the start barrier; False if the job ended first."""


class Transport(Participant, Protocol):
    """What a runner needs from its engine besides what every participant has: its inputs and outputs."""

    def receive(self, timeout: float) -> Input | None:
        """The next input, copied out and its source released; None if nothing came within `timeout` seconds."""

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> bool:
        """Hand an output to output queue `queue_index` (an index into the step's out_queues).

        Stamps the card's `slot_acquired` (the way on was free) and
        `handed_over` (the output is on its way) events, which only the
        transport can see.  False if the job ended first (the transport may
        have ended it, e.g. a full queue).
        """

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        """Final step: count the cards towards the target and ship them to the main process.

        Cards past the target are dropped.  True once the target is reached.
        The transport may hold counted cards briefly to ship several in one
        message, but ships them all by the time the target is reached, the
        input is idle or the runner reports Exited.
        """


class ClientTransport(Participant, Protocol):
    """What the load generator needs from its engine besides what every participant has: sending requests."""

    def wait_for_room(self) -> bool:
        """Closed loop: block until fewer than the concurrency are in flight; False if the job ended first."""

    def submit(self, request: Request) -> bool:
        """Send a request to step 0; False if it could not go (the request queue was full and the job ended)."""
