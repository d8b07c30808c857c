"""Models that fail on purpose, for the fault bench and its tests: dying holding plumbing, or hanging.

`DiesHolding` reaches into the local engine's shared objects, as a crash
would find them; `Hangs` stops making progress while staying alive, as a
deadlock, a read that never returns or a device that stopped answering
would.  They live here beside bench/faults.py and never among the models a
pipeline is built from.
"""
from __future__ import annotations

import gc
import inspect
import os
import signal
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import torch

from rnb.core.model import NOTHING_YET, Cards, NonTensors, Shapes, StepOutput, Tensors
from rnb.core.termination import Termination
from rnb.core.timecard import as_cards
from rnb.engines.local import plumbing as plumbing_module
from rnb.engines.local.plumbing import Plumbing
from rnb.engines.local.ring import MAX_CAPACITY
from rnb.pipeline.dotted import load_object


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
            # the module the plumbing reads its clock from, replaced by one whose time() kills
            vars(plumbing_module)["time"] = SimpleNamespace(time=die, sleep=time.sleep, monotonic=time.monotonic)
            plumbing.flag.raise_(Termination.TARGET_REACHED)
        elif self.hold == "finished":
            plumbing.finished.get_lock().acquire()
        elif self.hold == "status":
            plumbing.status._wlock.acquire()
        else:  # mid-write: the results ring's write lock taken and part of a message copied in, its end not moved
            plumbing.results._wlock.acquire()
            tail = plumbing.results._end_words[1] % MAX_CAPACITY   # the producers' word's byte position
            plumbing.results._store(tail, b"\x80\x04" + b"\0" * 14)
        die()


HOW = ("lock", "sleep", "spin")
_OWN_KEYWORDS = ("inner", "at_item", "at_init", "in_flush", "how", "busy_s")


def hang(how: str, what: str) -> None:
    """Never return, the way `how` says: "lock" (a deadlock), "sleep" (a call that never comes back), "spin" (a busy loop).

    Says on stderr when it began (epoch seconds), so the fault bench can time what follows from it.
    """
    print(f"fault: {what} hangs ({how}) at {time.time():.3f}", file=sys.stderr, flush=True)
    if how == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    while True:
        if how == "sleep":
            time.sleep(3600)


class Hangs:
    """A step that runs another model (`inner`, a dotted path, with the step's other keywords) and hangs where asked.

    `at_init`: while loading, before the inner model; `at_item`: on the item
    with that id, before the inner model sees it; `in_flush`: the first time
    the runner asks it to hand over what it holds (its input idle) after it
    took an item.  `how` is one of HOW.  It stays alive and makes no
    progress: only the job's stall watch can end it.  `busy_s`: every call
    first computes (a busy loop) for that many seconds, as a slow model
    does, the call that hangs included; with no hang asked for it is
    simply a slow step, which no stall watch may end.
    """

    def __init__(self, device: torch.device, inner: str = "models.toy.TinyConvNet", at_item: int | None = None,
                 at_init: bool = False, in_flush: bool = False, how: str = "lock", busy_s: float = 0.0,
                 **inner_kwargs: Any) -> None:
        if how not in HOW:
            raise ValueError(f"how must be one of {', '.join(HOW)}, not {how!r}")
        self.how, self.at_item, self.in_flush, self.busy_s = how, at_item, in_flush, busy_s
        self.name = f"{inner.rpartition('.')[2]} (bench.fault_models.Hangs)"
        if at_init:
            hang(how, f"{self.name} at init")
        self.model = load_object(inner)(device, **inner_kwargs)
        self.took = False

    @staticmethod
    def output_shape(inner: str = "models.toy.TinyConvNet", input_shapes: Shapes | None = None,
                     **kwargs: Any) -> Shapes | None:
        method = load_object(inner).output_shape
        arguments = {key: value for key, value in kwargs.items() if key not in _OWN_KEYWORDS}
        if "input_shapes" in inspect.signature(method).parameters:
            arguments["input_shapes"] = input_shapes
        return method(**arguments)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        self.took = True
        busy_until = time.monotonic() + self.busy_s
        while time.monotonic() < busy_until:
            pass
        if self.at_item is not None and self.at_item in {card.item_id for card in as_cards(time_card)}:
            hang(self.how, f"{self.name} on item {self.at_item}")
        return StepOutput(*self.model(tensors, non_tensors, time_card))

    def flush(self) -> StepOutput:
        if self.in_flush and self.took:
            hang(self.how, f"{self.name} in flush")
        return NOTHING_YET
