"""Load modes: how requests arrive, each mode declared once.

A load mode is one class here.  It declares the run keys that choose and
tune it (each a flag of benchmark.py and a key of a config's "run" object,
with its range), names itself in the job id, generates its arrival times,
and tells the analysis where its jobs go on a load curve.  The command line
(rnb.cli), the config's checks (rnb.pipeline.config), the job's settings
(rnb.engines.job.RunArgs), the client (rnb.engines.client) and the analysis
(rnb.analysis) read these declarations instead of keeping lists of their
own; docs/development.md says how to add a mode.

This module imports only rnb.flags, so that every layer may import it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import rnb.flags as flags

# The largest count a POSIX semaphore holds (SEM_VALUE_MAX on Linux): the bound of every queue and of the
# closed loop's requests in flight.
MAX_SEMAPHORE_VALUE = 2**31 - 1

Setting = int | float | str | None   # one load setting's value, as a flag, a config and meta.json give it


@dataclass(frozen=True)
class RunKey:
    """One setting of a load mode: a config's `run` key, a flag of benchmark.py, and a LoadSettings field.

    Its range is written once, as the phrase both refusals use: the command
    line's (`command line: --fps: expected a number > 0, found 0`) and the
    config's (`config.json: run.fps: expected a number > 0, found 0`).
    """

    name: str
    spellings: tuple[str, ...]
    metavar: str
    help: str
    integral: bool = False
    minimum: float = 0
    maximum: int | None = None
    above: bool = False                 # the value must exceed `minimum`, not merely reach it
    choices: tuple[str, ...] = ()       # a choice key: one of these strings

    @property
    def expected(self) -> str:
        """What the key accepts, as an error sentence says it after `expected`."""
        if self.choices:
            return "one of " + ", ".join(f'"{choice}"' for choice in self.choices)
        if self.integral:
            return (f"an integer >= {self.minimum:g}" if self.maximum is None
                    else f"an integer from {self.minimum:g} to {self.maximum}")
        return f"a number {'>' if self.above else '>='} {self.minimum:g}"

    def accepts(self, value: object) -> bool:
        """Whether a value from JSON or a parsed flag is in this key's range."""
        if self.choices:
            return isinstance(value, str) and value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integral and not isinstance(value, int)):
            return False
        return (math.isfinite(value) and value >= self.minimum and not (self.above and value == self.minimum)
                and (self.maximum is None or value <= self.maximum))

    def parse(self, text: str) -> Setting:
        """The argparse type of this key's flag: its value, or ArgumentTypeError in the project's words."""
        if self.choices:
            value: Setting = text
        elif self.integral:
            value = int(text) if text.strip().lstrip("+-").isdigit() else None
        else:
            try:
                value = float(text)
            except ValueError:
                value = None
        if not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected}, found {flags.shown(text)}")
        return value


@dataclass(frozen=True)
class LoadSettings:
    """Every load key's value for one job, after command line, config and defaults are combined.

    The fields are the run keys of the modes below (a test holds the two to
    each other); meta.json's `args` holds them flat, beside the job's other
    settings.
    """

    mean_interval_ms: float = 3.0
    concurrency: int | None = None


@dataclass(frozen=True)
class Arrival:
    """When one request is due, in seconds after the client's start; None: as soon as there is room."""

    due_s: float | None


@dataclass(frozen=True)
class CurvePoint:
    """Where a job goes on analyze.py's throughput-against-p99 curves."""

    curve: str       # appended to the config's name: "" for the open loop's curve
    order: float     # lightest load first
    label: str       # the load as the plot names the point


class LoadMode:
    """One way requests arrive; a subclass per mode, one instance of each in MODES."""

    name: ClassVar[str]
    keys: ClassVar[tuple[RunKey, ...]]   # the run keys this mode reads (a key may be shared by modes)

    def chosen(self, settings: LoadSettings) -> bool:
        """Whether these settings ask for this mode (MODES is asked in order, the first yes wins)."""
        raise NotImplementedError

    def job_label(self, settings: LoadSettings) -> str:
        """The load as the job id names it: `mi2` in `261201_193337-toy-mi2-v200`."""
        raise NotImplementedError

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        """The requests' due times, without end: the client takes as many as it sends."""
        raise NotImplementedError

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        """Where a logged job of this mode goes on a load curve, from its meta.json `args`."""
        raise NotImplementedError

    @property
    def saturating(self) -> bool:
        """Whether every request is offered at once, so the load is all the pipeline can take."""
        return False


MEAN_INTERVAL = RunKey("mean_interval_ms", flags.MEAN_INTERVAL, "MS", "Poisson mean inter-arrival in ms; 0 = bulk (default 3)")
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

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        concurrency = _number(args, "concurrency")
        return CurvePoint(" (closed loop)", concurrency, f"c {concurrency:g}")


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
        interval = _number(args, "mean_interval_ms")
        return CurvePoint("", -interval, f"mi {interval:g}")


# Asked in this order: the first mode whose `chosen` says yes is the job's.
MODES: tuple[LoadMode, ...] = (ClosedLoop(), Bulk(), Poisson())
# Every load key once, in the order the modes declare them: flags, run keys and LoadSettings fields.
LOAD_KEYS: dict[str, RunKey] = {key.name: key for mode in MODES for key in mode.keys}
DEFAULTS: dict[str, Setting] = dataclasses.asdict(LoadSettings())


def mode_of(settings: LoadSettings) -> LoadMode:
    """The job's load mode."""
    return next(mode for mode in MODES if mode.chosen(settings))


def logged_mode(args: Mapping[str, object]) -> LoadMode:
    """The load mode of a logged job, from the load keys of its meta.json `args` (or of an analyze.py row).

    The keys decide, as they did for the job; `load_mode`, which meta.json
    also holds, is for a reader, and a log from before it was written has none.
    """
    known = {key: args[key] for key in DEFAULTS if args.get(key) is not None}
    return mode_of(LoadSettings(**known))  # type: ignore[arg-type]


def _number(args: Mapping[str, object], key: str) -> float:
    value = args.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan
