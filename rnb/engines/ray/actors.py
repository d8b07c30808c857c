"""The Ray engine's side on the cluster: the job's actors and the transports the shared loops run on.

    JobControl (on the driver's node; rnb.engines.ray.control): the flag, the finished count, what the driver collects
    ClientActor ──push(Request)──▶ RunnerActor, step 0 ──push(Handoff, tensors)──▶ RunnerActor, step 1 ...
                                                   final step ──finish(cards)──▶ JobControl ──halt──▶ every actor

The client and every runner run the same loops as on the local engine
(rnb.engines.client.generate, rnb.engines.runner.Runner), each in a thread
of its own async actor, while the actor's event loop takes hand-offs, the
start signal and the halt.  A hand-off is an actor call carrying one item,
or several while the consumer is backlogged, whose tensors are an argument:
Ray moves them through its object store, across nodes when the consumer
lives elsewhere.  The call returns once the consumer has taken every item of
it off its inbox and copied the tensors out; until then each item holds one
of the producer's `num_shared_tensors` slots, as a shared slot does on the
local engine.  Of a queue's consumers, a producer hands each item to the one
with the fewest of its items still untaken, so replicas that share an input
queue share its work.  Every call an actor makes, hand-offs, finished cards
and reports, goes through its courier thread (rnb.engines.ray.handoffs).
"""
from __future__ import annotations

import asyncio
import faulthandler
import os
import queue
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from rnb.core.messages import Exited, Failed, Handoff, Request, Status
from rnb.core.model import NonTensors
from rnb.core.progress import Progress, empty_cells
from rnb.core.stages import StepEvents
from rnb.core.termination import POLL_S, Termination
from rnb.core.timecard import Cards, TimeCard, as_cards, now, set_clock_offset
from rnb.engines import client
from rnb.engines.buffers import LocalBuffers
from rnb.engines.participant import run_and_report
from rnb.engines.ray.handoffs import Courier, Outbox, Parcel
from rnb.engines.runner import Runner
from rnb.engines.stall import Look, cpu_seconds, demand_seconds
from rnb.engines.streams import step_zero_non_tensors
from rnb.engines.transport import RESULTS_BATCH, FinishedCards, Input
from rnb.pipeline.gpus import DEVICE_ORDER
from rnb.pipeline.plan import Placement

# Ray's own zero-copy path for CPU tensors: the consumer reads them straight out of the object store; and
# CUDA numbering GPUs as NVML does, so that the index Ray puts in CUDA_VISIBLE_DEVICES is the GPU it checked.
ACTOR_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", **DEVICE_ORDER}


@dataclass(frozen=True)
class Whereabouts:
    """Where an actor runs: what meta.json records of each process."""

    node_id: str
    pid: int
    gpu_ids: tuple[str, ...]   # the GPUs Ray gave it (its CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class RayWiring:
    """A runner's connections: the control, and the consumers of each of its out_queues (by position)."""

    control: Any
    consumers: tuple[tuple[Any, ...], ...]   # out_queues[i] -> the runner actors reading it
    num_slots: int                            # hand-offs it may have untaken at once (num_shared_tensors)
    count_at_once: bool = False               # final step, closed loop: cards go as soon as the input is empty


class _Member:
    """What the client and runner actors share: the start gate, the halt, and the thread their loop runs in."""

    def __init__(self, control: Any) -> None:
        # Ray warns that tensors read zero-copy must not be written to: consumers only copy them out.
        warnings.filterwarnings("ignore", message="Zero-copy tensor serialization is enabled")
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.control = control
        self.started = threading.Event()
        self.halted = threading.Event()
        self.loop_thread: int | None = None   # the native id of the thread its loop runs in, once it runs
        self.ray_threads: frozenset[int] = frozenset()   # the process's other threads when the loop began: Ray's
        self.progress: Progress | None = None  # a runner's progress cells (rnb.core.progress), in this process

    async def where(self) -> Whereabouts:
        context = ray.get_runtime_context()
        gpus = tuple(str(g) for g in context.get_accelerator_ids().get("GPU", ()))
        return Whereabouts(context.get_node_id(), os.getpid(), gpus)

    async def clock(self) -> float:
        """This node's time, for the driver's clock-offset round trips."""
        return time.time()

    async def start(self, clock_offset_s: float) -> None:
        """Open the start gate; from now on cards are stamped on the driver's clock."""
        set_clock_offset(clock_offset_s)
        self.started.set()

    async def halt(self) -> None:
        self.halted.set()

    async def look(self) -> Look:
        """The driver's periodic look: how far the runner has got, and the CPU its threads have used and asked for.

        The loop runs in a thread of its own, so the actor answers this even
        while its loop is stuck (in a lock, a read, a device call).  Ray's
        own threads in the process always use a little, which would hide a
        loop that stopped, so they are left out: start-up counts the loop's
        thread's CPU time; a running step the demand of that thread and of
        those started since (torch's, which compute its calls), not of those
        that were there when the loop began.
        """
        if self.loop_thread is None:
            return Look(None if self.progress is None else self.progress.read(), 0.0)
        return Look(None if self.progress is None else self.progress.read(), cpu_seconds(os.getpid(), self.loop_thread),
                    demand_seconds(os.getpid(), self.ray_threads))

    async def stacks(self) -> str:
        """Every thread's Python stack, as faulthandler writes them (the local engine's children write the same)."""
        with tempfile.TemporaryFile("w+") as file:
            faulthandler.dump_traceback(file, all_threads=True)
            file.seek(0)
            return file.read()

    async def _in_thread(self, transport: _RayParticipant, work: Callable[[], None],
                         device: torch.device | None = None) -> int:
        """Run the loop in a thread of its own, then wait for the calls its courier still holds (its last words)."""
        def run() -> int:
            self.loop_thread = threading.get_native_id()
            self.ray_threads = frozenset(int(name) for name in os.listdir("/proc/self/task")) - {self.loop_thread}
            code = run_and_report(transport.name, transport, work, device)
            transport.courier.flush()
            return code

        return await asyncio.get_running_loop().run_in_executor(None, run)


class _RayParticipant:
    """What the client's and the runners' Ray transports do alike (rnb.engines.transport.Participant).

    Its reports and its stop go through the courier, behind the hand-offs
    and cards posted before them: a Failed arrives before the stop it
    causes, an Exited after every card counted.
    """

    def __init__(self, member: _Member, name: str) -> None:
        self.member = member
        self.name = name
        self.courier = Courier(self._call_failed)

    @property
    def stopped(self) -> bool:
        return self.member.halted.is_set()

    def stop(self, reason: Termination) -> None:
        self.member.halted.set()
        self.courier.post(lambda: self.member.control.stop.remote(reason))

    def report(self, status: Status) -> None:
        self.courier.post(lambda: self.member.control.report.remote(status))

    def _call_failed(self, error: BaseException) -> None:
        """A call the courier could not make (on its thread): this participant failed, and the job ends."""
        self.member.halted.set()
        self.member.control.report.remote(Failed(self.name, f"{type(error).__name__}: {error}"))
        self.member.control.stop.remote(Termination.PROCESS_FAILED)

    def wait_for_start(self) -> bool:
        while not self.member.started.wait(POLL_S):
            if self.stopped:
                return False
        return not self.stopped


@dataclass(frozen=True)
class _Arrival:
    parcel: Parcel
    taken: Callable[[], None]     # counts it taken: the last of its call's parcels completes the producer's call


class _Countdown:
    """The parcels of one push call not yet taken; only the runner's loop thread counts them down."""

    def __init__(self, parcels: int, loop: asyncio.AbstractEventLoop, call: asyncio.Future[None]) -> None:
        self.left = parcels
        self.loop = loop
        self.call = call

    def one_taken(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.loop.call_soon_threadsafe(_settle, self.call)


class RunnerActor(_Member):
    """One runner: its inbox takes hand-offs while its thread runs the runner loop."""

    def __init__(self, control: Any, step: int, queue_size: int) -> None:
        super().__init__(control)
        self.step = step
        self.inbox: queue.Queue[_Arrival] = queue.Queue(queue_size)
        self.pending: set[asyncio.Future[None]] = set()
        self.progress = Progress(empty_cells())

    async def push(self, parcels: Sequence[Parcel]) -> None:
        """Take hand-offs into the inbox; return once the runner has taken every one (or the job ended)."""
        if self.halted.is_set():
            return
        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        countdown = _Countdown(len(parcels), asyncio.get_running_loop(), taken)
        for parcel in parcels:
            try:
                self.inbox.put_nowait(_Arrival(parcel, countdown.one_taken))
            except queue.Full:
                self.halted.set()
                full = Termination.REQUEST_QUEUE_FULL if self.step == 0 else Termination.INTER_STEP_QUEUE_FULL
                self.control.stop.remote(full)
                return
        self.pending.add(taken)
        taken.add_done_callback(self.pending.discard)
        await taken

    async def halt(self) -> None:
        """Stop the loop and let every producer's waiting hand-off return."""
        self.halted.set()
        for taken in list(self.pending):
            _settle(taken)

    async def run(self, spec: Placement, wiring: RayWiring) -> int:
        """The runner loop, until the job ends; 0 ok, 1 failed (reported to the control as Failed)."""
        transport = RayTransport(spec, wiring, self)
        return await self._in_thread(transport, lambda: Runner(spec, transport).run(), torch.device(spec.device))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RayTransport(_RayParticipant):
    """A runner's transport (rnb.engines.transport.Transport) over actor calls and Ray's object store."""

    def __init__(self, spec: Placement, wiring: RayWiring, member: RunnerActor) -> None:
        super().__init__(member, spec.name)
        self.spec = spec
        self.wiring = wiring
        self.inbox = member.inbox
        self.device = torch.device(spec.device)
        self.events = StepEvents(spec.step)
        self.inputs = LocalBuffers(torch.device(spec.input_device))
        # Each out_queue's consumers have a run of numbers of their own in the outbox, from first[queue].
        self.first = [sum(len(c) for c in wiring.consumers[:q]) for q in range(len(wiring.consumers))]
        targets = [actor for consumers in wiring.consumers for actor in consumers]
        self.outbox = Outbox(len(targets), lambda c, parcels: targets[c].push.remote(parcels), self.courier)
        self.finished = FinishedCards(lambda results: self.courier.post(lambda: member.control.finish.remote(results)))
        assert member.progress is not None
        self.progress = member.progress

    def _sync(self) -> None:
        if self.inputs.on_cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, timeout: float) -> Input | None:
        try:
            arrival = self.inbox.get(timeout=timeout)
        except queue.Empty:
            self.finished.send()  # the input is idle: a final step sends the cards it holds
            return None
        arrived = now()
        message = arrival.parcel.opened()
        if isinstance(message, Request):
            arrival.taken()
            return Input((), step_zero_non_tensors(message), message.card, arrived)
        # Copied out so the object store's copy can go, as a shared slot is released on the local engine.
        tensors = tuple(self.inputs.shaped(i, t).copy_(t, non_blocking=self.inputs.on_cuda)
                        for i, t in enumerate(arrival.parcel.tensors))
        self._sync()
        arrival.taken()
        return Input(tensors, message.non_tensors, message.time_card, arrived)

    def send(self, queue_index: int, tensors: tuple[torch.Tensor, ...], non_tensors: NonTensors, time_card: Cards) -> bool:
        if not self.outbox.wait_below(self.wiring.num_slots, lambda: self.stopped):
            return False
        cards = as_cards(time_card)
        for card in cards:
            card.record(self.events.slot_acquired)
        # The producer's own copies (Parcel): CUDA tensors go out through host memory (the copy waits for this
        # runner's stream), as the object store holds CPU tensors; a CPU output may be the model's buffer.
        payload = tuple(t.clone() if t.device.type == "cpu" else t.to("cpu") for t in tensors)
        consumers, first = self.wiring.consumers[queue_index], self.first[queue_index]
        chosen = self.outbox.least_loaded(range(first, first + len(consumers)))
        for card in cards:
            card.record(self.events.handed_over)
        message = Handoff(self.spec.step, self.spec.group, self.spec.instance, non_tensors, time_card)
        self.outbox.put(chosen, Parcel.of(message, payload))
        return True

    def finish(self, cards: tuple[TimeCard, ...]) -> bool:
        """Count at the JobControl, which ends the job itself at the target: always False here.

        Counted cards gather and go in one call once RESULTS_BATCH are held
        or the oldest has waited RESULTS_WAIT_S (FinishedCards), as a call
        per item would cost as much as a hop; the JobControl dates the end
        by the cards' own count, not by their arrival.  A closed loop's
        client waits for each count to send its next request, so there
        they go as soon as the input is empty.
        """
        self.finished.add(cards)
        if len(self.finished) >= RESULTS_BATCH or (self.wiring.count_at_once and self.inbox.empty()):
            self.finished.send()
        return False

    def report(self, status: Status) -> None:
        if isinstance(status, Exited):  # a runner's last word comes after every card it counted
            self.finished.send()
        super().report(status)


class ClientActor(_Member):
    """The load generator, whose thread runs rnb.engines.client.generate."""

    def __init__(self, control: Any, concurrency: int | None) -> None:
        super().__init__(control)
        self.in_flight = threading.Semaphore(concurrency) if concurrency else None

    async def release(self, count: int) -> None:
        """Closed loop: the final step finished `count` items."""
        if self.in_flight is not None:
            self.in_flight.release(count)

    async def run(self, spec: client.ClientSpec, step0: tuple[Any, ...], queue_size: int) -> int:
        transport = RayClientTransport(self, step0, queue_size)
        return await self._in_thread(transport, lambda: client.generate(spec, transport))


class RayClientTransport(_RayParticipant):
    """The client's transport (rnb.engines.transport.ClientTransport): requests as calls to step-0 runners.

    The request queue of the local engine holds at most -qs requests; here
    that bound is on the requests sent but not yet taken by any step-0 runner.
    """

    def __init__(self, member: ClientActor, step0: tuple[Any, ...], queue_size: int) -> None:
        super().__init__(member, "client")
        self.in_flight = member.in_flight
        self.queue_size = queue_size
        self.outbox = Outbox(len(step0), lambda c, parcels: step0[c].push.remote(parcels), self.courier)

    def wait_for_room(self) -> bool:
        if self.in_flight is not None:
            while not self.in_flight.acquire(timeout=POLL_S):
                if self.stopped:
                    return False
        return not self.stopped

    def submit(self, request: Request) -> bool:
        if self.outbox.total >= self.queue_size:
            self.stop(Termination.REQUEST_QUEUE_FULL)
            return False
        chosen = self.outbox.least_loaded(range(len(self.outbox.counts)))
        self.outbox.put(chosen, Parcel.of(request))
        return True

    def waiting(self) -> int:
        return self.outbox.total

    def drop(self, count: int) -> bool:
        self.courier.post(lambda: self.member.control.drop.remote(count))
        return self.stopped
