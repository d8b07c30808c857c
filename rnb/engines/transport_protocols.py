"""The seam between the engine-independent loops (runner, client) and an engine.

The runner loop (`rnb.engines.runner`) decides what happens to an item:
time-card stamps, the model call, segments, the selector, batcher flushes,
final-step checks.  How an input reaches a step, how outputs reach the next
one, how the start barrier, the termination flag and the job's results are
shared: that is the engine's, behind these two small protocols.  The local
engine implements them in `rnb.engines.local.shared_memory_transport` (shared slots and
rings of messages in shared memory); another engine implements the same methods.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rnb.core.messages import Request, Results, Status
from rnb.core.model import NonTensors
from rnb.core.progress import ClientCells, Progress
from rnb.core.stages import StepEvents
from rnb.core.termination import Termination
from rnb.core.timecard import Cards, TimeCard

if TYPE_CHECKING:
    import torch

# The final step sends counted cards to whoever counts the job in batches of up to this many: one
# message per item would cost both sides as much as a hop.
RESULTS_BATCH = 64
# The bound on holding: a counted card is on its way to the job's counter at most this long after it was
# counted, whatever the final step's loop does meanwhile (waits for input, or hangs in its next item).
RESULTS_WAIT_S = 0.05


class FinishedCards:
    """The final step's counted cards not yet sent to the job's counter (main, or Ray's JobControl).

    When a full batch goes is each engine's policy; holding, timing and
    sending are the same for both.  Whatever the policy, no card waits
    longer than `within_s`: a thread of the runner's process sends what is
    held once its oldest card is that old.  So a final step that then blocks
    for ever (a deadlock, a read that never returns, a device that stopped
    answering) has already sent every item it finished, and any ending of the
    job finds them in its log.  The thread starts with the first card, so
    only final steps have one; it sleeps while nothing is held.
    """

    def __init__(self, send: Callable[[Results], Any], within_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self.within_s = RESULTS_WAIT_S if within_s is None else within_s
        self._clock = clock  # seconds, only ever subtracted: a test gives one it moves by hand
        self._cards: list[TimeCard] = []
        self._held = threading.Condition(threading.Lock())  # guards _cards and oldest; the sender thread waits on it
        self._sender: threading.Thread | None = None
        self.oldest = 0.0  # when the first card held now was added (by the clock)

    def __len__(self) -> int:
        return len(self._cards)

    def add(self, cards: tuple[TimeCard, ...]) -> None:
        if not cards:
            return
        with self._held:
            if not self._cards:
                self.oldest = self._clock()
                self._held.notify()
            self._cards.extend(cards)
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_when_due, name="finished-cards", daemon=True)
            self._sender.start()

    def send(self) -> None:
        """Send what is held, if anything, as one Results."""
        with self._held:
            self._send_held()

    def _send_held(self) -> None:
        if self._cards:
            self._send(Results(tuple(self._cards)))
            self._cards = []

    def _send_when_due(self) -> None:
        with self._held:
            while True:
                if not self._cards:
                    self._held.wait()
                    continue
                due = self.oldest + self.within_s - self._clock()
                if due > 0:
                    self._held.wait(due)
                    continue
                try:
                    self._send_held()
                except Exception:  # the way out is closing (the process is leaving): its own last send reports
                    return


@dataclass(frozen=True)
class Stamps:
    """The names of the events the harness stamps at one step (rnb.core.stages.StepEvents), formatted once.

    A StepEvents property formats its name anew at each ask, and a card then
    hashes the new string to find where the event lives: paid at each of a
    hop's five stamps, that cost more than the stamps themselves.
    """

    arrived: str
    started: str
    finished: str
    slot_acquired: str
    handed_over: str
    device_ms: str
    flushed: str

    @staticmethod
    def of(step: int) -> Stamps:
        events = StepEvents(step)
        return Stamps(events.arrived, events.started, events.finished, events.slot_acquired, events.handed_over,
                      events.device_ms, events.flushed)


@dataclass(frozen=True)
class Input:
    """One input of a step, already the runner's own: the producer may reuse what it came from."""

    tensors: tuple[torch.Tensor, ...]   # () for step 0, whose input is a request
    non_tensors: NonTensors             # {"request": payload} for step 0
    time_card: Cards                    # one card, or a batch's
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

    @property
    def progress(self) -> Progress:
        """Where the runner writes how far it has got, in memory the driver reads (rnb.core.progress)."""

    def receive(self, timeout: float) -> Input | None:
        """The next input, copied out and its source released; None if nothing came within `timeout` seconds."""

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: NonTensors, time_card: Cards) -> bool:
        """Hand an output to output queue `queue_index` (an index into the step's out_queues).

        Stamps the card's `slot_acquired` (the way on was free) and
        `handed_over` (the output is on its way) events, which only the
        transport can see.  False if the job ended first (the transport may
        have ended it, e.g. a full queue).
        """

    def complete(self, cards: tuple[TimeCard, ...]) -> None:
        """Final step: the items are done, said to a client that times them itself (LoadGen's, which completes their
        samples) the moment their last call's work is, before the runner's bookkeeping; nothing for other clients.

        Every item the final step hands over is completed, before it is
        counted: LoadGen issues no more samples than -v (its max query
        count), so none of them is past the target.
        """

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        """Final step: count the cards towards the target and ship them to the main process.

        Cards past the target are dropped.  True once the target is reached.
        The transport may hold counted cards briefly to ship several in one
        message (FinishedCards), but ships each within RESULTS_WAIT_S of its
        count whatever the runner does next, and all of them by the time the
        target is reached, the input is idle or the runner reports Exited.
        """


class ClientTransport(Participant, Protocol):
    """What the load generator needs from its engine besides what every participant has: sending requests."""

    @property
    def waits(self) -> ClientCells:
        """Where the client says it waits for its next request's due time, in memory the driver reads."""

    def wait_for_room(self) -> bool:
        """Closed loop: block until fewer than the concurrency are in flight; False if the job ended first."""

    def submit(self, request: Request) -> bool:
        """Send a request to step 0; False if it could not go (the request queue was full and the job ended)."""

    def waiting(self) -> int:
        """How many submitted requests no step-0 runner has taken yet."""

    def drop(self, count: int) -> bool:
        """Count `count` dropped frames towards the target, as the final step counts finished items (streams under
        the drop policy, where -v counts the frames offered); True once the target is reached (the job ends)."""
