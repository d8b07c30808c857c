"""A CPU slot's shared memory: zeroed, shared with the children, and backed only where a job writes it."""
from __future__ import annotations

import psutil
import torch

from rnb.engines.local.lifeline import children_context
from rnb.engines.local.plumbing import SharedSlot, shared_zeros

MIB = 2**20
CTX = children_context()


def test_fresh_shared_zeros_hold_no_memory_until_written():
    before = psutil.Process().memory_info().rss
    tensor = shared_zeros((64, 1024, 1024), torch.float32)   # 256 MiB
    grown = psutil.Process().memory_info().rss - before
    assert (tensor.shape, tensor.dtype, tensor.is_shared()) == ((64, 1024, 1024), torch.float32, True)
    assert grown < 16 * MIB, f"{grown / MIB:.0f} MiB resident before any write"
    tensor[3].fill_(7.0)
    assert psutil.Process().memory_info().rss - before >= 4 * MIB   # the written 4 MiB, and no more needed
    assert int(tensor[3].eq(7.0).sum()) == 1024 * 1024 and not bool(tensor[4].any())


def _write_into(tensor: torch.Tensor) -> None:
    tensor.copy_(torch.arange(tensor.numel(), dtype=tensor.dtype).reshape(tensor.shape))


def test_a_slot_a_child_writes_is_seen_by_its_parent_in_every_dtype():
    slot = SharedSlot.allocate(CTX, ((2, 3), (4,)), torch.device("cpu"), (torch.uint8, torch.float64))
    assert [(t.dtype, t.shape, int(t.count_nonzero())) for t in slot.tensors] == [
        (torch.uint8, (2, 3), 0), (torch.float64, (4,), 0)]
    for tensor in slot.tensors:
        child = CTX.Process(target=_write_into, args=(tensor,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
    assert slot.tensors[0].tolist() == [[0, 1, 2], [3, 4, 5]] and slot.tensors[1].tolist() == [0.0, 1.0, 2.0, 3.0]
