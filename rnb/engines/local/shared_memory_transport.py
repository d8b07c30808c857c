"""The local engine's transport: one host, spawned processes, shared slots and rings of messages in shared memory.

A runner's outputs go into its own preallocated `SharedSlot`s (CUDA tensors
for a GPU runner, shared-memory tensors on the CPU); the queue to the next
step (a `RingQueue`, rnb.engines.local.ring) carries only a `Signal` naming
the slot.  The consumer copies the data out into its own reused buffers,
then sets the slot's `free` flag so the producer may write it again.
Requests and results travel on rings too, status messages on a plain
multiprocessing queue; the flag and the start gate are shared objects
(rnb.engines.local.plumbing.Plumbing).

This module also holds the two process entry points the main process spawns.
"""
from __future__ import annotations

import os
import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rnb.core.messages import Exited, Request, Results, Signal, Status, Wire
from rnb.core.model import NonTensors
from rnb.core.progress import ClientCells, Progress, empty_cells
from rnb.core.termination import POLL_S, Termination
from rnb.core.timecard import Cards, TimeCard, as_cards
from rnb.engines import client, loadgen
from rnb.engines.buffers import LocalBuffers
from rnb.engines.local.child import child_main
from rnb.engines.local.plumbing import PinnedHostSlots, Plumbing, SharedSlot
from rnb.engines.local.ring import QueueClosed
from rnb.engines.runner import Runner
from rnb.engines.streams import step_zero_non_tensors
from rnb.engines.transport_protocols import RESULTS_BATCH, FinishedCards, Input, Stamps
from rnb.pipeline.plan import Placement


@dataclass(frozen=True)
class LocalWiring:
    """A runner's own output slots, by (group, instance) of each producer the slots it reads, and its progress cells."""

    slots: tuple[SharedSlot, ...]
    sources: Mapping[tuple[int, int], tuple[SharedSlot, ...]]
    # RawArray('d', rnb.core.progress.CELLS), which the main process reads for its stall watch (a list: nobody reads)
    progress: Any = field(default_factory=empty_cells)

    @property
    def every_slot(self) -> tuple[SharedSlot, ...]:
        return (*self.slots, *(slot for slots in self.sources.values() for slot in slots))


class _LocalParticipant:
    """What the client's and the runners' transports do alike (rnb.engines.transport_protocols.Participant)."""

    def __init__(self, plumbing: Plumbing) -> None:
        self.plumbing = plumbing

    @property
    def stopped(self) -> bool:
        return self.plumbing.flag.is_set

    def stop(self, reason: Termination) -> None:
        self.plumbing.flag.raise_(reason)

    def report(self, status: Status) -> None:
        self.plumbing.status.put(status)

    def wait_for_start(self) -> bool:
        return self.plumbing.wait_for_start()


class LocalTransport(_LocalParticipant):
    """A runner's transport (rnb.engines.transport_protocols.Transport) over slots and queues."""

    def __init__(self, spec: Placement, target: int, wiring: LocalWiring, plumbing: Plumbing) -> None:
        super().__init__(plumbing)
        self.spec = spec
        self.target = target  # -v: items the final step must finish
        self.wiring = wiring
        self.device = torch.device(spec.device)
        self._cuda = self.device.type == "cuda"  # asked twice per hop; a torch.device attribute is not free
        self.input_device = torch.device(spec.input_device)
        self.events = Stamps.of(spec.step)
        self.inputs = LocalBuffers(self.input_device)
        self.inbox = plumbing.requests if spec.in_queue is None else plumbing.step_queues[spec.step - 1][spec.in_queue]
        self.outboxes = [plumbing.step_queues[spec.step][q] for q in spec.out_queues]
        self._next_slot = 0
        # A finished card waits for company in its batch to the main process at most RESULTS_WAIT_S (FinishedCards),
        # and not at all once the input is idle, the target is reached or the runner exits.
        self.finished = FinishedCards(self._ship)
        self.progress = Progress(wiring.progress)

    def _ship(self, results: Results) -> None:
        """Put counted cards on the results queue; once the job ended while the put waited, they are lost to the
        log (meta.json's counted_items says how many)."""
        try:
            self.plumbing.results.put_nowait(results)
        except QueueClosed:
            pass

    def _sync(self) -> None:
        """Wait for copies queued on the current CUDA stream (the runner's own)."""
        if self._cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, timeout: float) -> Input | None:
        try:
            message = self._next(timeout)
        except queue.Empty:
            return None
        arrived = time.time()
        if self.spec.in_queue is None:
            request = Request.from_wire(message)
            return Input((), step_zero_non_tensors(request), request.card, arrived)
        signal = Signal.from_wire(message)
        slot = self.wiring.sources[(signal.group, signal.instance)][signal.slot]
        tensors = slot.read(self.input_device, self.inputs)
        self._sync()
        slot.free.set()
        return Input(tensors, signal.non_tensors, signal.time_card, arrived)

    def _next(self, timeout: float) -> Wire:
        """The next message of the inbox; a final step whose input stayed idle all `timeout` sends the cards it holds.

        Not as soon as the input is empty: on a pipeline faster than the
        final step's wake-ups that would be one message to main per item.
        """
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            if self.spec.is_final:
                self.finished.send()
            raise

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: NonTensors, time_card: Cards) -> bool:
        index = self._acquire_slot()
        if index is None:
            return False
        cards = as_cards(time_card)
        # Separates waiting for a free slot (back-pressure from the next step) from the copy itself.
        for card in cards:
            card.record(self.events.slot_acquired)
        slot = self.wiring.slots[index]
        slot.write(tensors, f"{self.spec.name} ({self.spec.model})")
        self._sync()
        for card in cards:
            card.record(self.events.handed_over)
        signal = Signal(self.spec.step, self.spec.group, self.spec.instance, index, non_tensors, time_card)
        try:
            self.outboxes[queue_index].put_nowait(signal.wire())
        except queue.Full:
            slot.free.set()
            self.stop(Termination.INTER_STEP_QUEUE_FULL)
            return False
        except QueueClosed:  # the job ended while the put waited: nothing was written
            slot.free.set()
            return False
        return True

    def _acquire_slot(self) -> int | None:
        """The next free output slot, taken; None if the job ends while every slot is busy."""
        slots = self.wiring.slots
        while not self.stopped:
            for offset in range(len(slots)):
                index = (self._next_slot + offset) % len(slots)
                if slots[index].free.is_set():
                    slots[index].free.clear()
                    self._next_slot = (index + 1) % len(slots)
                    return index
            slots[self._next_slot].free.wait(POLL_S)
        return None

    def complete(self, cards: tuple[TimeCard, ...]) -> None:
        """Put the items' ids on the completions ring of a LoadGen client, which completes their samples; then
        offer this core to the thread that does (it stays this runner's where no one waits for it).

        Without the yield, on a host whose other cores are busy, the woken
        completer waited for the runner's bookkeeping to end: 50 us more
        per item at a load of 7 (docs/performance.md).
        """
        if self.plumbing.completions is not None:
            self.plumbing.completions.put_nowait(tuple(card.item_id for card in cards))
            os.sched_yield()

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        counted = self.plumbing.count_finished(len(cards), self.target)
        if counted is None:
            return False
        added, reached = counted
        accepted = cards[:added]
        self.finished.add(accepted)
        if reached or len(self.finished) >= RESULTS_BATCH:
            self.finished.send()
        if self.plumbing.in_flight is not None:
            for _ in cards:
                self.plumbing.in_flight.release()
        return reached

    def report(self, status: Status) -> None:
        if isinstance(status, Exited):  # a runner's last word comes after every card it counted
            self.finished.send()
        super().report(status)


class LocalClientTransport(_LocalParticipant):
    """The client's transport (rnb.engines.transport_protocols.ClientTransport): the request queue and the in-flight bound."""

    def __init__(self, plumbing: Plumbing, target: int) -> None:
        super().__init__(plumbing)
        self.target = target
        self.waits = ClientCells(plumbing.client_cells)

    def wait_for_room(self) -> bool:
        in_flight = self.plumbing.in_flight
        if in_flight is not None:
            while not in_flight.acquire(timeout=POLL_S):
                if self.stopped:
                    return False
        return not self.stopped

    def submit(self, request: Request) -> bool:
        try:
            self.plumbing.requests.put_nowait(request.wire())
        except queue.Full:
            self.stop(Termination.REQUEST_QUEUE_FULL)
            return False
        except QueueClosed:
            return False
        return True

    def waiting(self) -> int:
        return self.plumbing.requests.waiting()

    def drop(self, count: int) -> bool:
        counted = self.plumbing.count_finished(count, self.target)
        if counted is not None and counted[1]:
            self.stop(Termination.TARGET_REACHED)
        return self.stopped


@dataclass(frozen=True)
class DeviceFirst:
    """A runner's device, passed as its first spawn argument so that it is selected while unpickling.

    Unpickling the producers' CUDA slots opens their IPC handles, and with
    no current device chosen CUDA would also make a context on GPU 0 for
    every runner: hundreds of MB of GPU 0 per process, and a busy GPU 0 for
    jobs that never asked for it. Arguments are unpickled in order, so
    selecting the device as this one is rebuilt comes before any slot.
    """

    device: str

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return select_device, (self.device,)


def select_device(device: str) -> str:
    """Make a CUDA `device` this process's current one (nothing to do for the CPU); returns it."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return device


def runner_main(device: str, spec: Placement, target: int, wiring: LocalWiring, plumbing: Plumbing) -> None:
    """Entry point of a spawned runner process; `device` comes first (DeviceFirst) and is already current.

    A GPU runner page-locks the host slots it writes or reads before its model
    loads; whatever way the runner ends, its hold on every slot is released
    before the process leaves (release_slots).
    """
    transport = LocalTransport(spec, target, wiring, plumbing)
    pinned = PinnedHostSlots()
    on_cuda = torch.device(spec.device).type == "cuda"

    def work() -> None:
        if on_cuda:
            pinned.pin(wiring.every_slot)
        Runner(spec, transport).run()
    child_main(spec.name, plumbing, transport, work, torch.device(spec.device),
               release=lambda: release_slots(wiring, pinned, torch.device(spec.device)))


def release_slots(wiring: LocalWiring, pinned: PinnedHostSlots, device: torch.device) -> None:
    """A runner's last act: once none of its work still touches a slot, let go of every slot it holds.

    The CUDA slots it received from the main process are counted by torch's
    CUDA IPC until released; released here, the main process can free them
    when the job ends (rnb.engines.local.driver), and no "Producer process
    has been terminated before all shared CUDA tensors released" warning
    follows at its exit.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if pinned.pointers:
        pinned.unpin()
    for slot in wiring.every_slot:
        slot.release()


def client_main(spec: client.ClientSpec, plumbing: Plumbing) -> None:
    """Entry point of the spawned client process: RnB's client, or LoadGen completing from the completions ring."""
    transport = LocalClientTransport(plumbing, spec.videos)
    completions = plumbing.completions
    if completions is not None:
        child_main("client", plumbing, transport, lambda: loadgen.drive(spec, transport, completions))
    else:
        child_main("client", plumbing, transport, lambda: client.generate(spec, transport))
