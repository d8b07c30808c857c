"""The Ray job's shared state: the termination flag, the finished count and what the driver collects.

Its own module, apart from the runner and client actors, so that the
JobControl actor's process imports no torch (about 2.5 s of CPU in every
Ray job): nothing it holds or receives is a tensor.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rnb.core.messages import Results, Status
from rnb.core.termination import Termination
from rnb.core.timecard import TimeCard


@dataclass(frozen=True)
class ControlState:
    """What the driver takes from JobControl at each look: the flag, and what came in since the last look."""

    reason: Termination
    raised_at: float
    statuses: tuple[Status, ...]
    cards: tuple[TimeCard, ...]
    late: int = 0   # cards the final step counted after the flag's time: not counted here


class JobControl:
    """The job's shared state on Ray (a plain actor: one call at a time, in the order each caller sent them).

    It lives on the driver's node, so the time it stamps on the flag is on
    the driver's clock.  At the target the flag's time, the end of the job,
    is when the final step counted the last item it accepted (its stamp
    `counted`, on the driver's clock too), as the local engine raises its
    flag at the count: the cards may have waited a little on their way here.
    At the maximum duration the flag's time is the deadline itself, and a
    card counted after the flag's time is not counted, however soon it comes.
    """

    def __init__(self, target: int, counted: str) -> None:
        self.target = target
        self.counted = counted
        self.last_counted = 0.0
        self.finished = 0
        self.reason = Termination.RUNNING
        self.raised_at = 0.0
        self.deadline: float | None = None
        self.statuses: list[Status] = []
        self.cards: list[TimeCard] = []
        self.late = 0
        self.members: list[Any] = []
        self.client: Any = None

    def attach(self, members: Sequence[Any], client_actor: Any) -> None:
        """The actors to halt when the job ends, and the client to tell of finished items (closed loop) or None."""
        self.members, self.client = list(members), client_actor
        if self.reason != Termination.RUNNING:
            self._halt_all()

    def end_at(self, deadline: float) -> None:
        """The maximum duration ends the job at `deadline` (on the driver's clock), whoever sees it first: the
        driver's watch, or the final step counting a card after it."""
        self.deadline = deadline

    def stop(self, reason: Termination, at: float | None = None) -> None:
        """The first reason wins; every actor is told to halt.  The flag's time is `at`, or now."""
        if self.reason == Termination.RUNNING:
            self.reason, self.raised_at = Termination(reason), time.time() if at is None else at
            self._halt_all()

    def _halt_all(self) -> None:
        for member in self.members:
            member.halt.remote()

    def finish(self, results: Results) -> None:
        """Final step: count cards towards the target (those past it are dropped); stop at the target."""
        cards = results.cards
        stamps = [card.event(self.counted) or 0.0 for card in cards]
        if self.deadline is not None and any(stamp > self.deadline for stamp in stamps):
            self.stop(Termination.MAX_DURATION, self.deadline)
        if self.reason != Termination.RUNNING:
            in_time = tuple(card for card, stamp in zip(cards, stamps) if stamp <= self.raised_at)
            self.late += len(cards) - len(in_time)
            cards = in_time
        accepted = cards[: max(0, self.target - self.finished)]
        self.finished += len(accepted)
        self.cards.extend(accepted)
        self.last_counted = max([self.last_counted, *(card.event(self.counted) or 0.0 for card in accepted)])
        if self.client is not None:
            self.client.release.remote(len(cards))
        if self.finished >= self.target:
            self.stop(Termination.TARGET_REACHED, self.last_counted)

    def drop(self, count: int) -> None:
        """The client dropped `count` frames (streams under the drop policy): they count towards the target."""
        self.finished = min(self.target, self.finished + count)
        if self.finished >= self.target:
            self.stop(Termination.TARGET_REACHED)

    def report(self, status: Status) -> None:
        self.statuses.append(status)

    def collect(self) -> ControlState:
        state = ControlState(self.reason, self.raised_at, tuple(self.statuses), tuple(self.cards), self.late)
        self.statuses, self.cards, self.late = [], [], 0
        return state
