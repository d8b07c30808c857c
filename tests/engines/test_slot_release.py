"""Shared slots are let go of explicitly: children release what they received, main frees and collects (CPU side).

The CUDA side of the same code (CUDA IPC reference counts, no warning, no GPU
memory left after a job) runs in tests/engines/test_harness_gpu.py and bench/gpu_check.py.
"""
from __future__ import annotations

import multiprocessing

import pytest
import torch

from rnb.engines.local.driver import release_main_slots
from rnb.engines.local.plumbing import PinnedHostSlots, SharedSlot
from rnb.engines.local.shared_memory_transport import LocalWiring, release_slots


def _slot(shape: tuple[int, ...] = (4, 8)) -> SharedSlot:
    return SharedSlot.allocate(multiprocessing.get_context("spawn"), (shape, (2,)), torch.device("cpu"))


def test_a_released_slot_gives_up_its_memory_whoever_still_references_it():
    slot = _slot()
    storages = [tensor.untyped_storage() for tensor in slot.tensors]
    held_elsewhere = [slot, slot.tensors]  # a queue, a wiring, a frame: references the release must not wait for
    assert slot.nbytes == 4 * 8 * 4 + 2 * 4
    slot.release()
    assert all(tensor.numel() == 0 for tensor in held_elsewhere[1]) and slot.nbytes == 0
    assert [storage.nbytes() for storage in storages] == [128, 8]  # only these last handles keep the memory now


class FakeCudart:
    """Stands in for torch.cuda.cudart(): records which host memory was page-locked and unlocked."""

    def __init__(self, fail_with: int = 0) -> None:
        self.fail_with = fail_with
        self.calls: list[tuple[str, int, int]] = []  # (call, pointer, flags)

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, flags))
        return self.fail_with

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, 0))
        return 0


def test_a_gpu_runner_page_locks_each_host_slot_once_and_unlocks_it_before_the_release():
    own, source = _slot(), _slot((3,))
    wiring = LocalWiring((own,), {(0, 0): (source,), (0, 1): (source,)})  # one producer's slot read twice
    cudart = FakeCudart()
    pinned = PinnedHostSlots(cudart)
    assert pinned.pin(wiring.every_slot) == own.nbytes + source.nbytes
    registered = [ptr for kind, ptr, _ in cudart.calls if kind == "register"]
    assert len(registered) == 4 and sorted(registered) == sorted(
        t.untyped_storage().data_ptr() for t in (*own.tensors, *source.tensors))
    assert {flags for kind, _, flags in cudart.calls} == {1}  # cudaHostRegisterPortable
    release_slots(wiring, pinned, torch.device("cpu"))
    assert [kind for kind, _, _ in cudart.calls] == ["register"] * 4 + ["unregister"] * 4
    assert own.nbytes == source.nbytes == 0 and pinned.pointers == []


def test_a_slot_that_cannot_be_page_locked_is_one_sentence():
    with pytest.raises(RuntimeError) as caught:
        PinnedHostSlots(FakeCudart(fail_with=2)).pin([_slot((4,))])
    assert str(caught.value) == ("could not page-lock a 16-byte host slot for copies to and from the GPU "
                                 "(cudaHostRegister returned CUDA error 2)")


def test_main_frees_every_slot_after_the_job_and_without_cuda_slots_touches_no_cuda():
    wirings = [LocalWiring((_slot(),), {}), LocalWiring((_slot((2, 2)),), {})]
    assert release_main_slots(wirings, on_cuda=False) == {}
    assert all(slot.nbytes == 0 for wiring in wirings for slot in wiring.slots)
