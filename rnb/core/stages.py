"""The one vocabulary of where an item's time goes, used by the harness, the summaries, the plots and the README.

An item's time card collects epoch-second events (`StepEvents` names them);
its end-to-end latency splits, for every step, into five parts (`PARTS`)
that add up exactly to it:

    previous hand-over (or enqueue)
      │ queue ........ waiting in the step's input queue
    runner{k}_start
      │ sibling wait . at a step that merges segments: waiting for the item's other segments
    siblings{k}_arrived (merging steps only)
      │ copy ......... copying the input out of the producer's slot
    inference{k}_start
      │ inside ....... the model's call
    inference{k}_finish
      │ slot wait .... waiting for a free output slot (back-pressure from the next step)
    slot{k}_acquired
      │ copy ......... writing the output into the slot and signalling the next step
    runner{k}_finish

A part has one name people read ("slot wait") and one key that column names
spell it with ("slotwait", as in `slotwait1_ms` and `slotwait1_p99_ms`).

An item split into segments is followed, up to the step that merges them,
by its segment that reaches that step first (rnb.core.timecard): its
events stand for the item's, so the parts stay in order and add up, and what
the other segments made the item wait is the merging step's sibling wait.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

ENQUEUE = "enqueue"


@dataclass(frozen=True)
class StepEvents:
    """The names of the events the harness stamps on a time card at step k."""

    step: int

    @property
    def arrived(self) -> str:
        """The input was taken from the step's queue."""
        return f"runner{self.step}_start"

    @property
    def started(self) -> str:
        """The input is copied out; the model's call starts."""
        return f"inference{self.step}_start"

    @property
    def siblings_arrived(self) -> str:
        """A step that merges segments took the item's last segment (the item arrived with its first)."""
        return f"siblings{self.step}_arrived"

    @property
    def finished(self) -> str:
        """The model's call returned this output."""
        return f"inference{self.step}_finish"

    @property
    def flushed(self) -> str:
        """A holding model (a batcher) handed the item over from `flush`, its input idle: when that call began.

        Only items handed over so carry it; the others' output came from the
        call that took the batch's last item, which `started` already tells.
        """
        return f"flush{self.step}"

    @property
    def slot_acquired(self) -> str:
        """A free output slot was taken (steps that hand tensors on)."""
        return f"slot{self.step}_acquired"

    @property
    def handed_over(self) -> str:
        """The output is written and signalled (or, at the final step, counted)."""
        return f"runner{self.step}_finish"

    @property
    def device_ms(self) -> str:
        """The field of the device's own measure of the step's work (CUDA events), on steps whose work is asynchronous."""
        return f"device_ms{self.step}"

    @property
    def always(self) -> tuple[str, str, str, str]:
        """The events every step records, in order: the columns every job log has."""
        return (self.arrived, self.started, self.finished, self.handed_over)


@dataclass(frozen=True)
class Part:
    name: str      # what people read: summaries, reports, plot legends, the README
    key: str       # how column names spell it
    meaning: str   # one line for anyone who asks


QUEUE = Part("queue", "queue", "waiting in the step's input queue")
SIBLING_WAIT = Part("sibling wait", "siblingwait",
                    "at a step that merges segments: from the item's first segment to its last taken off the queue")
COPY = Part("copy", "copy", "copying the input out of the producer's slot and the output into the step's own")
SLOT_WAIT = Part("slot wait", "slotwait", "waiting for a free output slot: back-pressure from the next step")
INSIDE = Part("inside", "inside", "the model's call")
PARTS: tuple[Part, ...] = (QUEUE, SIBLING_WAIT, COPY, SLOT_WAIT, INSIDE)
END_TO_END = Part("end to end", "e2e", "from enqueue to the final step's hand-over")


def model_spans(columns: Iterable[str]) -> list[str]:
    """The spans models record inside their call as `<name>_start` / `<name>_finish` events (a loader's fetch or
    prefetch_wait, then decode), by name, among a table's `columns`."""
    names = set(columns)
    harness = ("runner", "inference", "slot")
    return sorted(name[: -len("_start")] for name in names
                  if name.endswith("_start") and not name.startswith(harness)
                  and f"{name[: -len('_start')]}_finish" in names)


def part_key(part: Part, step: int) -> str:
    """The column key of one part of one step, e.g. `slotwait1`."""
    return f"{part.key}{step}"


def part_latencies(table: pa.Table, num_steps: int) -> dict[str, np.ndarray]:
    """The end-to-end latency and every part of every step, in seconds, one value per item, by column key.

    The parts of all steps sum exactly to the end-to-end latency; a step
    that hands nothing on (the final step) has a slot wait of 0, one that
    merges no segments a sibling wait of 0.
    """
    latencies: dict[str, np.ndarray] = {}
    before = event_seconds(table, ENQUEUE)
    for k in range(num_steps):
        latencies.update(step_latencies(table, k, before))
        before = event_seconds(table, StepEvents(k).handed_over)
    return {END_TO_END.key: before - event_seconds(table, ENQUEUE), **latencies}


def step_columns(step: int) -> tuple[str, ...]:
    """The event columns `step_latencies` reads (the optional ones need not exist)."""
    events = StepEvents(step)
    return (*events.always, events.slot_acquired, events.siblings_arrived)


def step_latencies(table: pa.Table, step: int, before: np.ndarray) -> dict[str, np.ndarray]:
    """The parts of one step, in seconds per item, from the previous hand-over (`before`) and the step's events.

    Only the step's own columns are read, so a caller short of memory can
    load one step at a time.
    """
    def waited(until: str, since: np.ndarray) -> np.ndarray:
        """Time from `since` to the event `until`, 0 for items (or jobs) that never recorded it."""
        if until not in table.column_names:
            return np.zeros_like(since)
        times = event_seconds(table, until)
        return np.where(np.isnan(times), 0.0, times - since)

    events = StepEvents(step)
    arrived, started, finished, handed_over = (event_seconds(table, name) for name in events.always)
    slot_wait = waited(events.slot_acquired, finished)
    sibling_wait = waited(events.siblings_arrived, arrived)
    return {
        part_key(QUEUE, step): arrived - before,
        part_key(SIBLING_WAIT, step): sibling_wait,
        part_key(COPY, step): (started - arrived) + (handed_over - finished) - slot_wait - sibling_wait,
        part_key(SLOT_WAIT, step): slot_wait,
        part_key(INSIDE, step): finished - started,
    }


def event_seconds(table: pa.Table, name: str) -> np.ndarray:
    """An event column as float seconds (NaN where missing)."""
    return table.column(name).to_numpy(zero_copy_only=False).astype(float)
