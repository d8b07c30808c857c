"""The GPU run's checks of the device itself, each in an isolated process: the seam's cost, UUIDs, pinned
slots, reduced precision."""
from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench.bounded import Deadline, isolated

if TYPE_CHECKING:
    from rnb.core.device import DeviceMark
from bench.gpu_kit import ISOLATED_S, SEAM_SPIN_MS, Check, Datasets, verdict

# ---------------------------------------------------------------- the device seam

class SpinningDevice(Protocol):
    """What the seam check needs of a device: marks in its queue, work of about a given length, a synchronise."""

    events_bound_us: float  # what the seam may cost per item on it
    spin_tolerance: float   # how far, as a fraction, its marks' reading of a spin may be from the host's

    def mark(self) -> DeviceMark: ...

    def spin(self, ms: float) -> None: ...

    def synchronize(self) -> None: ...


class CudaSpinner:
    """A CUDA stream as the seam check's device: CudaQueue's events, torch.cuda._sleep's spins.

    The spin's cycles per millisecond are counted by the host's clock around
    a synchronise (after 0.2 s of warm-up: an idle GPU clocks at a fraction
    of its boost), so that the events' reading of a spin is compared with a
    clock they did not set.
    """

    events_bound_us = 100.0
    spin_tolerance = 0.05

    def __init__(self, cycles: int = 10_000_000) -> None:
        import torch

        from rnb.core.device import CudaQueue

        self.stream = torch.cuda.Stream()
        self.queue = CudaQueue(self.stream)
        until = time.perf_counter() + 0.2
        while time.perf_counter() < until:
            self._sleep(cycles // 10)
            self.synchronize()
        started = time.perf_counter()
        self._sleep(cycles)
        self.synchronize()
        self.cycles_per_ms = cycles / ((time.perf_counter() - started) * 1000)

    def _sleep(self, cycles: int) -> None:
        import torch

        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(cycles)

    def mark(self) -> DeviceMark:
        return self.queue.mark()

    def spin(self, ms: float) -> None:
        self._sleep(int(ms * self.cycles_per_ms))

    def synchronize(self) -> None:
        self.stream.synchronize()


def seam_costs(device_type: Callable[[], SpinningDevice], items: int = 2000) -> dict[str, float]:
    """µs per item of the runner's seam (two marks, a wait, an elapsed time) and of a bare synchronise, and a
    SEAM_SPIN_MS spin read by the device's marks and by the host's clock around them."""
    device = device_type()

    def per_item(work: Callable[[], object]) -> float:
        started = time.perf_counter()
        for _ in range(items):
            work()
        return (time.perf_counter() - started) / items * 1e6

    def marks() -> float:
        began = device.mark()
        done = device.mark()
        done.wait()
        return done.ms_since(began)
    per_item(marks)  # warm-up
    costs = {"events_us": per_item(marks), "synchronize_us": per_item(device.synchronize)}
    device.synchronize()
    started = time.perf_counter()
    began = device.mark()
    device.spin(SEAM_SPIN_MS)
    done = device.mark()
    done.wait()
    host_ms = (time.perf_counter() - started) * 1000
    return {**costs, "spin_device_ms": done.ms_since(began), "spin_host_ms": host_ms,
            "events_bound_us": device.events_bound_us, "spin_tolerance": device.spin_tolerance}


def check_seam(device_type: Callable[[], SpinningDevice], datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    costs = isolated(seam_costs, device_type, deadline=deadline, own_s=ISOLATED_S)
    device_ms, host_ms = costs["spin_device_ms"], costs["spin_host_ms"]
    agree = abs(device_ms - host_ms) <= max(1.0, costs["spin_tolerance"] * host_ms) and host_ms >= SEAM_SPIN_MS / 2
    ok = costs["events_us"] < costs["events_bound_us"] and agree
    return verdict("seam", ok, f"marks {costs['events_us']:.1f} us/item, bare synchronise {costs['synchronize_us']:.1f} "
                               f"us/item (empty items); a {SEAM_SPIN_MS:g} ms spin read {device_ms:.2f} ms by the marks, "
                               f"{host_ms:.2f} ms by the host's clock", **costs)

# ---------------------------------------------------------------- isolated calls

def compare_uuids() -> dict[str, Any]:
    import torch

    from rnb.pipeline.gpus import GpuMismatchError, Nvml, check_device_uuid, nvml_uuid

    with Nvml() as nvml:
        nvml_uuids = [nvml.device(i).uuid for i in range(nvml.device_count())]
    torch_uuids = [nvml_uuid(str(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())]
    try:
        check_device_uuid(0, "GPU-00000000-0000-0000-0000-000000000000", "step0-g0-r0")
        refused = ""
    except GpuMismatchError as error:
        refused = str(error)
    return {"nvml": nvml_uuids, "torch": torch_uuids, "refused": refused}


def check_uuid(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_uuids, deadline=deadline, own_s=ISOLATED_S)
    same = found["torch"] == found["nvml"][: len(found["torch"])]
    ok = same and "expected torch's cuda:0 to be NVML's GPU 0" in found["refused"]
    return verdict("uuid", ok, f"torch {found['torch']} == NVML {found['nvml']}: {same} "
                               f"(CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')}); a wrong one refused: "
                               f"{bool(found['refused'])}", **found)


def pinned_copy() -> dict[str, Any]:
    import torch

    from rnb.engines.local.plumbing import PinnedHostSlots, SharedSlot

    slot = SharedSlot.allocate(multiprocessing.get_context("spawn"), ((16, 2**20),), torch.device("cpu"))
    before = slot.tensors[0].is_pinned()
    pinned = PinnedHostSlots()
    pinned.pin([slot])
    data = torch.rand((16, 2**20), device="cuda:0")
    torch.cuda.synchronize()
    started = time.perf_counter()
    slot.write((data,), "gpu check")
    returned = time.perf_counter() - started
    torch.cuda.current_stream().synchronize()
    done = time.perf_counter() - started
    equal = bool(torch.equal(slot.tensors[0], data.cpu()))
    result = {"pinned_before": before, "pinned": slot.tensors[0].is_pinned(), "returned_ms": returned * 1000,
              "done_ms": done * 1000, "equal": equal}
    pinned.unpin()
    slot.release()
    return result


def check_pinned(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(pinned_copy, deadline=deadline, own_s=ISOLATED_S)
    ok = not found["pinned_before"] and found["pinned"] and found["equal"] and found["returned_ms"] < 0.5 * found["done_ms"]
    return verdict("pinned", ok, f"shared host slot page-locked: {found['pinned']}; 64 MiB device-to-host copy "
                                 f"returned after {found['returned_ms']:.2f} ms, done after {found['done_ms']:.2f} ms",
                   **found)


def compare_dtypes() -> dict[str, Any]:
    import torch

    from models.r2p1d import R2P1DRunner
    from rnb.core.timecard import TimeCard

    device = torch.device("cuda:0")
    x = torch.rand((4, 3, 8, 112, 112), device=device)
    found: dict[str, Any] = {}
    reference = None
    for dtype, layout in (("float32", False), ("float16", False), ("bfloat16", False), ("float32", True),
                          ("bfloat16", True)):
        net = R2P1DRunner(device, 1, 5, num_clips=4, clip_length=8, size=112, dtype=dtype, channels_last=layout)
        for _ in range(3):
            (out,), _, _ = net((x,), {}, TimeCard(0))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            (out,), _, _ = net((x,), {}, TimeCard(0))
        torch.cuda.synchronize()
        rate = 20 / (time.perf_counter() - started)
        out = out.float()
        reference = out if reference is None else reference
        name = dtype + ("+channels_last" if layout else "")
        found[name] = {"items_per_s": rate,
                       "relative_error": float((out - reference).abs().max() / reference.abs().max().clamp_min(1e-12))}
    return found


def check_dtype(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_dtypes, deadline=deadline, own_s=ISOLATED_S)
    bounds = {"float16": 0.02, "bfloat16": 0.1, "float32+channels_last": 0.01, "bfloat16+channels_last": 0.1}
    ok = all(found[name]["relative_error"] <= bound for name, bound in bounds.items())
    return verdict("dtype", ok, "; ".join(f"{name} {value['items_per_s']:.0f} items/s (error {value['relative_error']:.1e})"
                                          for name, value in found.items()), **found)
