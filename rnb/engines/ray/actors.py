"""The Ray engine's side on the cluster: the job's actors (their transports: rnb.engines.ray.actor_transports, runner_transport).

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

This module imports no torch, nor anything that does, at module level: a
process that receives an actor's handle loads the actor's class, and the
JobControl holds every actor's handle (to halt them).  What a loop needs is
imported by the actor's `run`, in its own process.
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
from typing import TYPE_CHECKING, Any

import ray

from rnb.core.progress import ClientCells, Progress, empty_cells, empty_client_cells
from rnb.core.termination import Termination
from rnb.core.timecard import set_clock_offset

if TYPE_CHECKING:
    import torch

    from rnb.engines.client import ClientSpec
    from rnb.engines.ray.actor_transports import RayParticipant
    from rnb.engines.ray.handoffs import Parcel
    from rnb.engines.stall import Look
    from rnb.pipeline.plan import Placement


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
        self.waits: ClientCells | None = None   # the client's wait for its next request's due time, likewise

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
        from rnb.engines.stall import Look, cpu_seconds, demand_seconds

        progress = None if self.progress is None else self.progress.read()
        client = None if self.waits is None else self.waits.read()
        if self.loop_thread is None:
            return Look(progress, 0.0, client=client)
        return Look(progress, cpu_seconds(os.getpid(), self.loop_thread), demand_seconds(os.getpid(), self.ray_threads),
                    client)

    async def stacks(self) -> str:
        """Every thread's Python stack, as faulthandler writes them (the local engine's children write the same)."""
        with tempfile.TemporaryFile("w+") as file:
            faulthandler.dump_traceback(file, all_threads=True)
            file.seek(0)
            return file.read()

    async def _in_thread(self, transport: RayParticipant, work: Callable[[], None],
                         device: torch.device | None = None) -> int:
        """Run the loop in a thread of its own, then wait for the calls its courier still holds (its last words)."""
        from rnb.engines.participant import run_and_report

        def run() -> int:
            self.loop_thread = threading.get_native_id()
            self.ray_threads = frozenset(int(name) for name in os.listdir("/proc/self/task")) - {self.loop_thread}
            code = run_and_report(transport.name, transport, work, device)
            transport.courier.flush()
            return code

        return await asyncio.get_running_loop().run_in_executor(None, run)


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
        from rnb.engines.ray.runner_transport import RayTransport
        from rnb.engines.runner import Runner

        transport = RayTransport(spec, wiring, self)
        return await self._in_thread(transport, lambda: Runner(spec, transport).run(), transport.device)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ClientActor(_Member):
    """The load generator, whose thread runs rnb.engines.client.generate."""

    def __init__(self, control: Any, concurrency: int | None) -> None:
        super().__init__(control)
        self.in_flight = threading.Semaphore(concurrency) if concurrency else None
        self.waits: ClientCells = ClientCells(empty_client_cells())

    async def release(self, count: int) -> None:
        """Closed loop: the final step finished `count` items."""
        if self.in_flight is not None:
            self.in_flight.release(count)

    async def run(self, spec: ClientSpec, step0: tuple[Any, ...], queue_size: int) -> int:
        from rnb.engines.client import generate
        from rnb.engines.ray.actor_transports import RayClientTransport

        transport = RayClientTransport(self, step0, queue_size)
        return await self._in_thread(transport, lambda: generate(spec, transport))
