"""Whose CUDA contexts count as the job's own when a GPU is checked free, and how a child learns them.

The processes NVML lists on a GPU may include the checking process itself
and those that started it (a bench or pytest that already ran CUDA work,
then starts a job): they are the job's own (`Family`).  Inside a container
with its own pid namespace NVML reports host pids, which match nothing
here; then the family's CUDA contexts are counted instead: this process's
own, and those its ancestors declared in the environment they started it
with (`child_environment`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from rnb.pipeline.nvml import nvml_uuid

# CUDA's numbering of GPUs that is NVML's: set for the main process, every child and every Ray actor and task.
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# GPU UUIDs (NVML's form), one per CUDA context that the processes which started this one hold, comma-separated.
ANCESTOR_CONTEXTS_ENV = "RNB_ANCESTOR_GPU_CONTEXTS"


def contexts_here() -> list[str]:
    """The GPUs (NVML UUIDs) on which this process holds a CUDA context: none unless torch has initialised CUDA.

    Asking creates no context: torch's primary-context query reads the driver's state of each device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return [nvml_uuid(str(torch.cuda.get_device_properties(index).uuid)) for index in range(torch.cuda.device_count())
            if torch._C._cuda_hasPrimaryContext(index)]


def _declared(environ: Mapping[str, str]) -> list[str]:
    return [uuid for uuid in environ.get(ANCESTOR_CONTEXTS_ENV, "").split(",") if uuid]


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a job this process starts as a subprocess (a bench, a test, a tool).

    GPUs are numbered as NVML numbers them, and this process's CUDA contexts
    (with those its own ancestors declared) are declared as the job's own, so
    that the job's busy check does not take them for a stranger's where NVML
    reports pids of another namespace.
    """
    env = dict(os.environ if base is None else base)
    for key, value in DEVICE_ORDER.items():
        env.setdefault(key, value)
    held = [*_declared(env), *contexts_here()]
    if held:
        env[ANCESTOR_CONTEXTS_ENV] = ",".join(held)
    return env


@dataclass(frozen=True)
class Strangers:
    """The compute processes on one GPU that are not the job's own."""

    count: int
    pids: tuple[int, ...]  # the strangers' own where NVML shares this pid namespace; else every pid it listed as unknown
    unseen: int            # the job's own contexts that NVML listed under pids of another namespace (0: pids compared)

    def __bool__(self) -> bool:
        return self.count > 0

    def describe(self) -> str:
        pids = ", ".join(str(pid) for pid in self.pids)
        if not self.unseen:
            return f"compute processes on it (pids {pids})"
        return (f"{self.count} compute process(es) on it besides this job's own {self.unseen} (NVML reports pids of "
                f"another pid namespace: {pids})")


@dataclass(frozen=True)
class Family:
    """The processes whose CUDA contexts count as the job's own: this one, those that started it, what they declared."""

    pids: frozenset[int]
    contexts: Mapping[str, int]  # NVML UUID -> CUDA contexts the family holds on that GPU (as far as it knows)

    @staticmethod
    def here(environ: Mapping[str, str] | None = None, held: Callable[[], list[str]] | None = None) -> Family:
        pids = {os.getpid()}
        try:
            pids.update(parent.pid for parent in psutil.Process().parents())
        except psutil.Error:  # a parent gone meanwhile: the ones found still count
            pass
        counts: dict[str, int] = {}
        for uuid in [*_declared(os.environ if environ is None else environ), *(held or contexts_here)()]:
            counts[uuid] = counts.get(uuid, 0) + 1
        return Family(frozenset(pids), counts)

    def strangers(self, uuid: str, listed: tuple[int, ...]) -> Strangers:
        """Who else computes on the GPU `uuid`, given the pids NVML lists on it.

        A listed pid of the family is its own.  Contexts the family holds but
        NVML did not list under a family pid were listed under pids of another
        namespace: that many of the unknown pids are the family's too.
        """
        unknown = tuple(pid for pid in listed if pid not in self.pids)
        unseen = max(0, self.contexts.get(uuid, 0) - (len(listed) - len(unknown)))
        return Strangers(max(0, len(unknown) - unseen), unknown, unseen)

