"""Models that fail on purpose in ways only the harness's own plumbing allows: for the fault bench and its tests.

They reach into the local engine's shared objects, as a crash would find
them, so they live here beside bench/faults.py and never among the models
a pipeline is built from.
"""
from __future__ import annotations

import gc
import os
import signal
import struct
import time
from types import SimpleNamespace
from typing import Any

import torch

from rnb.core.termination import Termination
from rnb.core.timecard import as_cards
from rnb.engines.local import plumbing as plumbing_module
from rnb.engines.local.plumbing import Plumbing


class DiesHolding:
    """A final step that, on item `at_item`, SIGKILLs itself while holding a piece of the job's shared plumbing.

    `hold` says which: "flag" (in the middle of raising the termination
    flag), "finished" (the lock of the finished-items count), "status" (the
    write lock of the status queue), "results" (half a message written into
    the results queue).  Whatever a dead child held, the main process must
    still end the job with its log: nothing it waits on may be held by a child.
    The plumbing is found among the process's objects, as a crash would find it.
    """

    HOLDS = ("flag", "finished", "status", "results")

    def __init__(self, device: torch.device, hold: str = "flag", at_item: int = 3) -> None:
        if hold not in self.HOLDS:
            raise ValueError(f"hold must be one of {', '.join(self.HOLDS)}, not {hold!r}")
        self.hold = hold
        self.at_item = at_item

    @staticmethod
    def output_shape(**kwargs: Any) -> None:
        return None

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict,
                 time_card: Any) -> tuple[tuple[torch.Tensor, ...], dict, Any]:
        if self.at_item in {card.item_id for card in as_cards(time_card)}:
            self._die_holding(next(o for o in gc.get_objects() if isinstance(o, Plumbing)))
        return (), non_tensors, time_card

    def _die_holding(self, plumbing: Plumbing) -> None:
        def die(*_: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        if self.hold == "flag":  # the flag reads the clock once it has claimed the right to be raised
            plumbing_module.time = SimpleNamespace(time=die, sleep=time.sleep, monotonic=time.monotonic)
            plumbing.flag.raise_(Termination.TARGET_REACHED)
        elif self.hold == "finished":
            plumbing.finished.get_lock().acquire()
        elif self.hold == "status":
            plumbing.status._wlock.acquire()
        else:  # a header announcing 4096 bytes, then 16 of them
            os.write(plumbing.results._writer.fileno(), struct.pack("!i", 4096) + b"\x80\x04" + b"\0" * 14)
        die()
