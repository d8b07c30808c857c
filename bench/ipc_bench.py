"""P5: an 18 MiB hand-off between two processes through the harness's shared slots against a queue of tensors
or of numpy arrays, and the producer process the P1h hop costs reuse."""
from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from bench.common import Effort, Goal, Row, measure_pair
from rnb.engines.buffers import LocalBuffers
from rnb.engines.local.plumbing import SharedSlot

HANDOFF_TIMEOUT_S = 60.0  # no single 18 MB hand-off takes anywhere near this; past it the peer is gone

HANDOFF_SHAPE = (8, 3, 16, 112, 112)  # a loader's output of 8 clips of 16 frames at 112x112: 18.4 MiB of float32
HANDOFF_MIB = torch.Size(HANDOFF_SHAPE).numel() * 4 / 2**20


DEPTH = 2  # hand-offs in flight: two slots, or a queue bounded at two


class _Outputs:
    """The producer's per-item outputs, stamped with the item number so the consumer can check it.

    fresh=False cycles through a few preallocated tensors, so only the
    hand-off is timed (DEPTH bounds how far the producer runs ahead, so a
    tensor is never restamped while a queue's feeder thread still pickles
    it).  fresh=True makes a new tensor per item, as a model returning a new
    output does; torch's queue needs that, since it shares a tensor's memory
    rather than copying it, and a reused tensor would be overwritten under
    the consumer.
    """

    def __init__(self, fresh: bool) -> None:
        self.fresh = fresh
        self.pool = [torch.rand(HANDOFF_SHAPE) for _ in range(1 if fresh else DEPTH + 2)]

    def get(self, item: int) -> torch.Tensor:
        output = self.pool[0].clone() if self.fresh else self.pool[item % len(self.pool)]
        output.view(-1)[0] = item
        return output


def _slot_producer(slots: tuple[SharedSlot, ...], signals: Any, fresh: bool, commands: Any) -> None:
    """Child: per command, hand `count` outputs over through the slots, as a runner does."""
    outputs = _Outputs(fresh)
    while (count := commands.get(timeout=HANDOFF_TIMEOUT_S)) is not None:
        for item in range(count):
            index = item % len(slots)
            if not slots[index].free.wait(HANDOFF_TIMEOUT_S):
                raise TimeoutError(f"P5 slot producer: slot {index} was not released within {HANDOFF_TIMEOUT_S:g} s")
            slots[index].free.clear()
            slots[index].write((outputs.get(item),), "P5 slot producer")
            signals.put(index)


def _queue_producer(out: Any, as_numpy: bool, fresh: bool, commands: Any) -> None:
    """Child: per command, put `count` outputs on a queue (as numpy arrays, or as torch tensors)."""
    outputs = _Outputs(fresh)
    while (count := commands.get(timeout=HANDOFF_TIMEOUT_S)) is not None:
        for item in range(count):
            output = outputs.get(item)
            out.put(output.numpy() if as_numpy else output, timeout=HANDOFF_TIMEOUT_S)


class Peer:
    """A producer process and the consumer side of its hand-off, living across all repetitions."""

    def __init__(self, ctx: Any, target: Callable[..., None], receive: Callable[[Any], int],
                 inbox: Any, *args: Any) -> None:
        self.commands = ctx.Queue()
        self.inbox = inbox
        self.receive = receive
        self.process = ctx.Process(target=target, args=(*args, self.commands), daemon=True)
        self.process.start()

    def throughput(self, count: int) -> float:
        """items/s of `count` hand-offs, each checked to be the item expected (`receive` gives its number)."""
        started = time.perf_counter()
        self.commands.put(count)
        for item in range(count):
            try:
                message = self.inbox.get(timeout=HANDOFF_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(f"P5: the producer (exit code {self.process.exitcode}) sent nothing "
                                   f"for {HANDOFF_TIMEOUT_S:g} s") from None
            stamp = self.receive(message)
            if stamp != item:
                raise RuntimeError(f"P5: expected item {item} from the producer, received item {stamp}")
        return count / (time.perf_counter() - started)

    def close(self) -> None:
        self.commands.put(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _slot_peer(ctx: Any, fresh: bool) -> Peer:
    slots = tuple(SharedSlot.allocate(ctx, (HANDOFF_SHAPE,), torch.device("cpu")) for _ in range(DEPTH))
    signals = ctx.Queue()
    buffers = LocalBuffers(torch.device("cpu"))  # what a runner does: one reused buffer, no allocation per item

    def receive(index: int) -> int:
        (data,) = slots[index].read(torch.device("cpu"), buffers)
        slots[index].free.set()
        return int(data.view(-1)[0])
    return Peer(ctx, _slot_producer, receive, signals, slots, signals, fresh)


def _queue_peer(ctx: Any, as_numpy: bool, fresh: bool) -> Peer:
    inbox = ctx.Queue(DEPTH)
    def receive(output: Any) -> int:
        return int((torch.from_numpy(output) if as_numpy else output).view(-1)[0])
    return Peer(ctx, _queue_producer, receive, inbox, inbox, as_numpy, fresh)


def p5_ipc(effort: Effort) -> list[Row]:
    count = effort.pick(10, 40)
    ctx = mp.get_context("spawn")
    peers = {"slot": _slot_peer(ctx, False), "numpy": _queue_peer(ctx, True, False),
             "fresh slot": _slot_peer(ctx, True), "torch": _queue_peer(ctx, False, True)}

    def side(label: str, peer: str) -> tuple[str, str, Callable[[], float]]:
        return label, "items/s", lambda: peers[peer].throughput(count)
    try:
        return [
            measure_pair("P5", f"{HANDOFF_MIB:.1f} MiB float tensor between two processes: "
                         "shared slot / pickled through a multiprocessing queue", Goal(">=", 5),
                         side("slot", "slot"), side("pickle", "numpy"), effort.reps,
                         note=f"{count} items per rep, {DEPTH} in flight; queue side: multiprocessing.Queue of "
                              "tensor.numpy() (pickled bytes through a pipe)"),
            measure_pair("P5t", "same with a new output tensor per item: shared slot / torch.multiprocessing queue",
                         Goal(">=", 1), side("slot", "fresh slot"), side("torch queue", "torch"), effort.reps,
                         note="torch's queue copies each new tensor into new shared memory and passes a file "
                              "descriptor (no byte pickling); both sides pay the new tensor; our goal: slots no slower"),
        ]
    finally:
        for peer in peers.values():
            peer.close()
