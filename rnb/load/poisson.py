"""RnB's own modes: Poisson arrivals at a mean interval, bulk (every request at once) and a closed loop."""
from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from typing import ClassVar

import rnb.flags as flags
from rnb.load.inputs import MAX_WAIT_S
from rnb.load.keys import MAX_SEMAPHORE_VALUE, RunKey
from rnb.load.mode import Arrival, CurvePoint, LoadMode, logged_number
from rnb.load.settings import LoadSettings

MEAN_INTERVAL = RunKey("mean_interval_ms", flags.MEAN_INTERVAL, "MS",
                       "Poisson mean inter-arrival in ms; 0 = bulk (default {default:g})",
                       maximum=MAX_WAIT_S * 1000)
CONCURRENCY = RunKey("concurrency", ("--concurrency",), "N",
                     "closed loop: keep N requests in flight, -mi is then ignored (default: off, open loop)",
                     integral=True, minimum=1, maximum=MAX_SEMAPHORE_VALUE)


class ClosedLoop(LoadMode):
    """N requests in flight; the next one goes as the final step finishes one (the engine's semaphore)."""

    name = "closed_loop"
    keys = (CONCURRENCY,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.concurrency is not None

    def job_label(self, settings: LoadSettings) -> str:
        return f"c{settings.concurrency}"

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        while True:
            yield Arrival(None)

    # Its curve on analyze.py's plots, the key ordering its points, and their labels' prefix.
    curve: ClassVar[tuple[str, str, str]] = (" (closed loop)", "concurrency", "c")

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        name, key, prefix = self.curve
        size = logged_number(args, key)
        return CurvePoint(name, size, f"{prefix} {size:g}")


class Bulk(LoadMode):
    """Every request at once (-mi 0), as RnB's bulk mode: the request queue is made to hold them all."""

    name = "bulk"
    keys = (MEAN_INTERVAL,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.mean_interval_ms == 0

    def job_label(self, settings: LoadSettings) -> str:
        return "mi0"

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        while True:
            yield Arrival(None)

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        return CurvePoint("", math.inf, "mi 0")   # the heaviest open-loop load there is

    @property
    def saturating(self) -> bool:
        return True


class Poisson(LoadMode):
    """Open loop with exponential gaps of mean -mi ms: it never waits for completions."""

    name = "poisson"
    keys = (MEAN_INTERVAL,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.mean_interval_ms > 0

    def job_label(self, settings: LoadSettings) -> str:
        return f"mi{settings.mean_interval_ms:g}"

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        rng = random.Random(seed)
        due = 0.0
        while True:
            due += rng.expovariate(1000.0 / settings.mean_interval_ms)
            yield Arrival(due)

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        interval = logged_number(args, "mean_interval_ms")
        return CurvePoint("", -interval, f"mi {interval:g}")

    def open_loop(self, settings: LoadSettings) -> bool:
        return True

