"""Shared plumbing of the local engine between the main process, the client and the runners.

The main process builds all of it before spawning, so every child gets the
same queues, flag and shared tensors as spawn arguments.  Tensors move only
through preallocated `SharedSlot`s; queues carry the small messages of
rnb.core.messages.
"""
from __future__ import annotations

import copyreg
import io
import math
import multiprocessing.queues
import pickle
import queue
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from rnb.core.termination import POLL_S, Termination
from rnb.engines.buffers import LocalBuffers

# How often a child looks at the start gate: the start barrier's skew between processes.
START_POLL_S = 0.002


class TerminationFlag:
    """A job-wide stop flag; the first reason raised wins, with the time it was raised.

    The time matters: throughput ends when the final step counts the last
    item, not when the main process gets around to noticing.

    No process may ever wait on another here.  A multiprocessing lock whose
    holder is SIGKILLed stays locked for ever, and every process reads this
    flag at every poll; so reading takes no lock (the reason and the time are
    plain shared memory), and raising takes a one-shot token without
    blocking (the first taker wins, the token is never given back).  A
    process killed between taking the token and writing the reason leaves the
    flag unraised but blocks nobody: the main process, which sees it die,
    then writes the flag itself (`take_over`).
    """

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("i", int(Termination.RUNNING))
        self._when = ctx.RawValue("d", 0.0)
        self._token = ctx.Lock()

    def raise_(self, reason: Termination) -> bool:
        """Set the flag unless another reason got there first; True if this call won."""
        if not self._token.acquire(False):
            return False
        self._when.value = time.time()  # before the reason: whoever sees the reason sees its time
        self._value.value = int(reason)
        return True

    def take_over(self, reason: Termination) -> bool:
        """The main process's raise: also when a process took the token and died before writing the reason.

        True if this call set the flag.  (Should the token's taker still be
        alive, its write may land after this one: either way the job ends.)
        """
        if self.raise_(reason):
            return True
        if self.is_set:
            return False
        self._when.value = time.time()
        self._value.value = int(reason)
        return True

    @property
    def reason(self) -> Termination:
        return Termination(self._value.value)

    @property
    def is_set(self) -> bool:
        return self._value.value != Termination.RUNNING

    @property
    def raised_at(self) -> float:
        return self._when.value


class SlotFlag:
    """Whether a slot is free: a flag in shared memory, with a semaphore to wake a producer waiting on it.

    It answers what a multiprocessing Event would (`is_set`, `set`, `clear`,
    `wait`), and is asked at every hop; an Event pays a lock, a condition and
    its notifications in Python for each, while a shared byte and one
    semaphore post cost a fraction of a microsecond.  Only the slot's producer
    clears and waits, only its consumer sets.
    """

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 1)
        self._wake = ctx.Semaphore(0)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1
        self._wake.release()

    def clear(self) -> None:
        self._value.value = 0
        # Wake-ups left by sets nobody waited for would only cost spurious wake-ups later.
        while self._wake.acquire(False):
            pass

    def wait(self, timeout: float) -> bool:
        """True once the flag is set; False if `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not self._value.value:
            left = deadline - time.monotonic()
            if left <= 0 or not self._wake.acquire(timeout=left):
                return bool(self._value.value)
        return True


@dataclass(frozen=True)
class SharedSlot:
    """One preallocated output buffer of a runner, reused for many items.

    `free` is set while nobody needs the data: the producer clears it before
    writing, the consumer sets it once it has copied the data out.  `sizes`
    (shared memory) holds the valid first-dimension size of each tensor.
    Every hop writes and reads a slot, so both skip the slicing a full tensor
    does not need.
    """

    tensors: tuple[torch.Tensor, ...]
    sizes: Any  # multiprocessing RawArray of int64, one per tensor
    free: SlotFlag
    forms: tuple[tuple[int, ...], ...]  # each tensor's shape, kept as plain ints: torch builds a new Size per ask

    @staticmethod
    def allocate(ctx: Any, shapes: tuple[tuple[int, ...], ...], device: torch.device,
                 dtypes: tuple[torch.dtype, ...] | None = None) -> SharedSlot:
        """Zeroed shared buffers; float32 unless the model's output_dtypes() says otherwise."""
        dtypes = dtypes or (torch.float32,) * len(shapes)
        tensors = tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in zip(shapes, dtypes))
        if device.type == "cpu":
            for tensor in tensors:
                tensor.share_memory_()
        else:
            torch.cuda.synchronize(device)  # zeroed before any other process can see it
        return SharedSlot(tensors, ctx.RawArray("q", len(shapes)), SlotFlag(ctx), tuple(tuple(shape) for shape in shapes))

    def write(self, outputs: tuple[torch.Tensor, ...], where: str) -> None:
        """Copy outputs in (asynchronously on the current stream for CUDA); the caller syncs."""
        if len(outputs) != len(self.tensors):
            raise ValueError(f"{where}: the model returned {len(outputs)} output tensors but output_shape() declares {len(self.tensors)}")
        for index, (output, slot, form) in enumerate(zip(outputs, self.tensors, self.forms)):
            shape = output.shape
            if len(shape) != len(form) or shape[0] > form[0] or shape[1:] != form[1:]:
                raise ValueError(f"{where}: output tensor {index} has shape {tuple(shape)}, which does not fit output_shape() {form}")
            (slot if shape[0] == form[0] else slot[: shape[0]]).copy_(output, non_blocking=True)
            self.sizes[index] = shape[0]

    def read(self, device: torch.device, buffers: LocalBuffers | None = None) -> tuple[torch.Tensor, ...]:
        """Copies of the valid rows on `device`; the caller syncs, then releases the slot.

        With `buffers` the copies land in the consumer's reused buffers (views
        of them are returned, valid until the next read into the same
        buffers); without, each read allocates new tensors.
        """
        # Only a copy onto a CUDA device runs on the caller's stream, which the caller syncs;
        # a copy to the CPU must be complete when it returns.
        non_blocking = buffers.on_cuda if buffers is not None else device.type == "cuda"
        copies = []
        for index, (slot, size, form) in enumerate(zip(self.tensors, self.sizes[:], self.forms)):
            full = size == form[0]
            valid = slot if full else slot[:size]
            if buffers is None:
                copies.append(valid.to(device, copy=True, non_blocking=non_blocking))
            else:
                buffer = buffers.like(index, slot)
                copies.append((buffer if full else buffer[:size]).copy_(valid, non_blocking=non_blocking))
        return tuple(copies)


class HopQueue(multiprocessing.queues.Queue):
    """A multiprocessing queue whose `get` waits on one poll object kept for the queue's lifetime.

    The standard queue builds and tears down a selector at every `get` with
    a timeout, which costs more than the rest of the message on a no-op hop;
    everything else (the feeder thread, the locks, the capacity) is the
    standard queue's.
    """

    def _reset(self, after_fork: bool = False) -> None:
        super()._reset(after_fork)
        self._poller: select.poll | None = None
        self._poll = self._wait_readable

    def _wait_readable(self, timeout: float = 0.0) -> bool:
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._reader.fileno(), select.POLLIN)
        return bool(self._poller.poll(max(0, math.ceil(timeout * 1000))))


class StepQueue(HopQueue):
    """An inter-step queue whose producer writes each message to the pipe itself, with no feeder thread.

    The standard queue hands every message to a feeder thread: a condition
    notified, a thread woken, the GIL passed to it and back, at every hop;
    that cost more than the pickling and the write together.  The producer
    here pickles and writes in its own thread under the queue's write lock;
    the capacity (-qs) is counted as before, so a full queue still ends the
    job.  A write never blocks the producer for good: it waits for room in
    the pipe a poll interval at a time and drops the message once the job
    has ended.  The room is there in practice: every message holds one of
    its producer's slots until a consumer has read it, so at most the
    producers' slots' worth of messages sit in the pipe.  Nor does a
    producer wait for good on the write lock of one killed while writing.
    """

    def __init__(self, maxsize: int, flag: TerminationFlag, *, ctx: Any) -> None:
        self._flag = flag
        super().__init__(maxsize, ctx=ctx)

    def __getstate__(self) -> tuple:
        return (*super().__getstate__(), self._flag)

    def __setstate__(self, state: tuple) -> None:
        *queue_state, self._flag = state
        super().__setstate__(tuple(queue_state))

    def _reset(self, after_fork: bool = False) -> None:
        super()._reset(after_fork)
        self._room: select.poll | None = None
        self._reducers: dict | None = None

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Write `obj` now; queue.Full when the queue holds its capacity (never waits for a free place)."""
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(False):
            raise queue.Full
        data = self._dumps(obj)
        if not self._until(lambda: self._wlock.acquire(timeout=POLL_S)):
            return  # a producer killed while writing holds the lock for good; the job is ending anyway
        try:
            if self._until(self._room_in_pipe):
                self._send_bytes(data)
        finally:
            self._wlock.release()

    def _dumps(self, obj: Any) -> memoryview:
        """`obj` pickled as multiprocessing's ForkingPickler does, without copying its reducer table each time.

        ForkingPickler builds a pickler with a fresh copy of copyreg's and its
        own reducers (torch registers some 80) for every message; the table is
        taken once here, in the process that puts, after torch has registered
        its reducers on import.
        """
        if self._reducers is None:
            self._reducers = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers}
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = self._reducers
        pickler.dump(obj)
        return buffer.getbuffer()

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def _until(self, ready: Callable[[], bool]) -> bool:
        """True once `ready()` (which waits up to a poll interval) is; False if the job ended first."""
        while not ready():
            if self._flag.is_set:
                return False
        return True

    def _room_in_pipe(self) -> bool:
        if self._room is None:
            self._room = select.poll()
            self._room.register(self._writer.fileno(), select.POLLOUT)
        return bool(self._room.poll(math.ceil(POLL_S * 1000)))


@dataclass(frozen=True)
class Plumbing:
    """Everything the children share: queues, the flag, counters and the start gate.

    `step_queues[k][q]` is output queue q of step k (the input of the step-k+1
    groups whose in_queue is q).  `in_flight` is None except in closed loop,
    where it bounds the requests the client may have outstanding.
    """

    requests: Any
    step_queues: tuple[dict[int, Any], ...]
    results: Any       # rnb.core.messages.Results, final step -> main
    status: Any        # rnb.core.messages.Ready, Failed, Exited: child -> main
    flag: TerminationFlag
    finished: Any      # shared count of finished items
    start: Any         # shared byte, set to 1 by main once every child is ready (no lock: see TerminationFlag)
    in_flight: Any     # Semaphore or None

    @staticmethod
    def build(ctx: Any, queue_names: list[set[int]], queue_size: int, concurrency: int | None,
              request_queue_size: int | None = None) -> Plumbing:
        """Every queue holds `queue_size` messages, the request queue `request_queue_size` if given."""
        flag = TerminationFlag(ctx)
        return Plumbing(
            requests=HopQueue(request_queue_size or queue_size, ctx=ctx),
            step_queues=tuple({q: StepQueue(queue_size, flag, ctx=ctx) for q in sorted(names)} for names in queue_names),
            results=HopQueue(ctx=ctx),
            status=ctx.Queue(),
            flag=flag,
            finished=ctx.Value("q", 0),
            start=ctx.RawValue("b", 0),
            in_flight=ctx.Semaphore(concurrency) if concurrency else None,
        )

    def open_start_gate(self) -> None:
        """Main: let every child start (they look every START_POLL_S)."""
        self.start.value = 1

    def wait_for_start(self) -> bool:
        """Block until main opens the start gate; False if the job ended first."""
        while not self.start.value:
            if self.flag.is_set:
                return False
            time.sleep(START_POLL_S)
        return not self.flag.is_set
