"""Shared plumbing of the local engine between the main process, the client and the runners.

The main process builds all of it before spawning, so every child gets the
same queues, flag and shared tensors as spawn arguments.  Tensors move only
through preallocated `SharedSlot`s; queues carry the small messages of
rnb.core.messages.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any, Protocol

import torch

from rnb.core.progress import empty_client_cells
from rnb.core.termination import POLL_S, Termination
from rnb.engines.buffers import LocalBuffers
from rnb.engines.local.ring import REQUEST_BYTES, RING_BYTES, RingQueue

# The results queue is not bounded by -qs: the final step's batches wait only for room in its ring.
RESULTS_MAXSIZE = 1 << 30
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

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue("i", int(Termination.RUNNING))
        self._when = ctx.RawValue("d", 0.0)
        self._token = ctx.Lock()

    def raise_(self, reason: Termination, at: float | None = None) -> bool:
        """Set the flag unless another reason got there first, dated `at` (default now); True if this call won."""
        if not self._token.acquire(False):
            return False
        self._when.value = time.time() if at is None else at  # before the reason: whoever sees the reason sees its time
        self._value.value = int(reason)
        return True

    def take_over(self, reason: Termination, at: float | None = None) -> bool:
        """The main process's raise: also when a process took the token and died before writing the reason.

        True if this call set the flag.  (Should the token's taker still be
        alive, its write may land after this one: either way the job ends.)
        """
        if self.raise_(reason, at):
            return True
        if self.is_set:
            return False
        self._when.value = time.time() if at is None else at
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

    def __init__(self, ctx: BaseContext) -> None:
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
            if left <= 0:
                return bool(self._value.value)
            # A timed-out wait goes round again: the semaphore times by the wall clock, which may end it a little
            # before the monotonic deadline.
            self._wake.acquire(timeout=left)
        return True


def shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in fresh shared memory whose pages cost nothing until they are written.

    `torch.zeros(...).share_memory_()` zeroes the bytes in private memory and
    then copies them into shared memory: a main process with a hundred slots
    of R(2+1)D clips spent 10 s of CPU and held 4 GB on it before its first
    item.  Fresh shared memory reads as zeros already, and only the slots a
    job writes are ever backed.
    """
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    strides = torch.empty(shape, dtype=dtype, device="meta").stride()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


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
    def allocate(ctx: BaseContext, shapes: tuple[tuple[int, ...], ...], device: torch.device,
                 dtypes: tuple[torch.dtype, ...] | None = None) -> SharedSlot:
        """Zeroed shared buffers; float32 unless the model's output_dtypes() says otherwise."""
        dtypes = dtypes or (torch.float32,) * len(shapes)
        if device.type == "cpu":
            tensors = tuple(shared_zeros(shape, dtype) for shape, dtype in zip(shapes, dtypes))
        else:
            tensors = tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in zip(shapes, dtypes))
            torch.cuda.synchronize(device)  # zeroed before any other process can see it
        return SharedSlot(tensors, ctx.RawArray("q", len(shapes)), SlotFlag(ctx), tuple(tuple(shape) for shape in shapes))

    def write(self, outputs: tuple[torch.Tensor, ...], where: str) -> None:
        """Copy outputs in (asynchronously on the current stream for CUDA); the caller syncs."""
        if len(outputs) != len(self.tensors):
            raise ValueError(f"{where}: the model returned {len(outputs)} output tensors but output_shape() declares "
                             f"{len(self.tensors)}")
        for index, (output, slot, form) in enumerate(zip(outputs, self.tensors, self.forms)):
            shape = output.shape
            if shape != form:  # a full output (the usual case) needs no slicing of shapes, each a new torch.Size
                if len(shape) != len(form) or shape[0] > form[0] or shape[1:] != form[1:]:
                    raise ValueError(f"{where}: output tensor {index} has shape {tuple(shape)}, which does not fit "
                                     f"output_shape() {form}")
                slot = slot[: shape[0]]
            slot.copy_(output, True)  # non_blocking, passed by position: torch parses a keyword at each call
            self.sizes[index] = shape[0]

    @property
    def nbytes(self) -> int:
        return sum(tensor.untyped_storage().nbytes() for tensor in self.tensors)

    def release(self) -> None:
        """Let go of this process's hold on the slot's memory, however many references to the slot remain.

        Each tensor is pointed at an empty storage, so the shared one is given
        up here and now even while queues, wirings or frames still reference
        the slot.  For a CUDA slot received from the main process that
        decrements the CUDA IPC reference torch counts for it in shared
        memory (a process that exits without doing so leaves the main
        process unable to free the slot, and torch warns at its exit); for
        the main process's own slot it frees the allocation.
        """
        for tensor in self.tensors:
            tensor.set_(torch.empty(0, dtype=tensor.dtype, device=tensor.device).untyped_storage())

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
                copies.append((buffer if full else buffer[:size]).copy_(valid, non_blocking))
        return tuple(copies)


class CudaRuntime(Protocol):
    """The two calls of the CUDA runtime that page-lock host memory (torch.cuda.cudart() offers them)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int: ...

    def cudaHostUnregister(self, ptr: int) -> int: ...


CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context of the process, not only the current one


class PinnedHostSlots:
    """Host slots page-locked in this process (cudaHostRegister), so copies between them and a GPU are asynchronous.

    A copy between a GPU and pageable memory is staged by the driver through
    a pinned buffer of its own, and the CPU waits for it; from page-locked
    memory it is one DMA that the stream runs while the CPU goes on.  A slot
    must also be shared with the other processes, and the two do not combine
    in one allocation: `pin_memory()` allocates with cudaHostAlloc, which no
    other process can map (torch's `share_memory_` on such a tensor moves it
    into fresh, unpinned shared memory).  So slots stay shared memory, made
    by the main process, and each GPU runner page-locks its own mapping of
    them when it starts, as torch.distributed does for shared state dicts.
    Registration is per process and per mapping; it is undone before release.
    """

    def __init__(self, cudart: CudaRuntime | None = None) -> None:
        self._cudart = cudart
        self.pointers: list[int] = []

    def pin(self, slots: Iterable[SharedSlot]) -> int:
        """Page-lock every CPU tensor of `slots` (CUDA ones are skipped); the bytes pinned."""
        cudart = self._cudart or torch.cuda.cudart()
        pinned = 0
        for slot in slots:
            for tensor in slot.tensors:
                storage = tensor.untyped_storage()
                if tensor.device.type != "cpu" or storage.data_ptr() in self.pointers or not storage.nbytes():
                    continue
                code = int(cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(), CUDA_HOST_REGISTER_PORTABLE))
                if code != 0:
                    raise RuntimeError(f"could not page-lock a {storage.nbytes()}-byte host slot for copies to and "
                                       f"from the GPU (cudaHostRegister returned CUDA error {code})")
                self.pointers.append(storage.data_ptr())
                pinned += storage.nbytes()
        return pinned

    def unpin(self) -> None:
        cudart = self._cudart or torch.cuda.cudart()
        for pointer in self.pointers:
            cudart.cudaHostUnregister(pointer)
        self.pointers.clear()


@dataclass(frozen=True)
class Plumbing:
    """Everything the children share: queues, the flag, counters and the start gate.

    `step_queues[k][q]` is output queue q of step k (the input of the step-k+1
    groups whose in_queue is q).  `in_flight` is None except in closed loop,
    where it bounds the requests the client may have outstanding.
    """

    requests: RingQueue
    step_queues: tuple[dict[int, RingQueue], ...]
    results: RingQueue  # rnb.core.messages.Results, final step -> main
    status: Any         # multiprocessing Queue of rnb.core.messages.Ready, Failed, Exited: child -> main
    flag: TerminationFlag
    finished: Any      # shared count of finished items
    start: Any         # shared byte, set to 1 by main once every child is ready (no lock: see TerminationFlag)
    in_flight: Any     # Semaphore or None
    client_cells: Any  # RawArray('d', CLIENT_CELLS): the client's wait for its next due time (rnb.core.progress)
    completions: RingQueue | None = None   # finished item ids, final step -> a LoadGen client (rnb.engines.loadgen)

    @staticmethod
    def build(ctx: BaseContext, queue_names: list[set[int]], queue_size: int, concurrency: int | None,
              request_queue_size: int | None = None, completions: bool = False) -> Plumbing:
        """Every queue holds `queue_size` messages, the request queue `request_queue_size` if given; `completions`
        adds the queue of finished items' ids that a LoadGen client completes its samples from."""
        flag = TerminationFlag(ctx)
        requests = request_queue_size or queue_size
        return Plumbing(
            requests=RingQueue(requests, flag, ctx=ctx, name="request queue",
                               capacity=max(RING_BYTES, REQUEST_BYTES * requests)),
            step_queues=tuple({q: RingQueue(queue_size, flag, ctx=ctx, name=f"inter-step queue {q} (step {k} to step {k + 1})",
                                            advice="; pass less in non_tensors") for q in sorted(names)}
                              for k, names in enumerate(queue_names)),
            results=RingQueue(RESULTS_MAXSIZE, flag, ctx=ctx, name="results queue"),
            status=ctx.Queue(),
            flag=flag,
            finished=ctx.Value("q", 0),
            start=ctx.RawValue("b", 0),
            in_flight=ctx.Semaphore(concurrency) if concurrency else None,
            client_cells=_cells(ctx, empty_client_cells()),
            completions=RingQueue(RESULTS_MAXSIZE, flag, ctx=ctx, name="completions queue") if completions else None,
        )

    @property
    def rings(self) -> tuple[RingQueue, ...]:
        """Every queue that is a ring: requests, the inter-step queues, results (and a LoadGen client's completions)."""
        return (self.requests, *(ring for queues in self.step_queues for ring in queues.values()), self.results,
                *([self.completions] if self.completions is not None else []))

    def queued(self) -> dict[int, int]:
        """How many messages wait in each step's input queues (the request queue is step 0's), by step."""
        waiting = {0: self.requests.waiting()}
        for k, queues in enumerate(self.step_queues):
            if queues:   # the final step has none
                waiting[k + 1] = sum(ring.waiting() for ring in queues.values())
        return waiting

    def count_finished(self, count: int, target: int) -> tuple[int, bool] | None:
        """Add up to `count` to the finished count, never past `target`: (how many it added, whether the target
        is reached); None if the job ended while this waited for the lock."""
        lock = self.finished.get_lock()
        while not lock.acquire(timeout=POLL_S):  # a replica killed holding it must not wedge this one
            if self.flag.is_set:
                return None
        try:
            total = self.finished.get_obj()  # under the lock already: the Value's own accessors would take it again
            added = min(count, max(0, target - total.value))
            total.value += added
            return added, total.value >= target
        finally:
            lock.release()

    @property
    def finished_count(self) -> int:
        """The finished count, read without its lock: a child killed while counting holds that lock for good."""
        return int(self.finished.get_obj().value)

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


def _cells(ctx: BaseContext, values: list[float]) -> Any:
    cells = ctx.RawArray("d", len(values))
    cells[:] = values
    return cells
