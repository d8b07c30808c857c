"""What a load mode is: the record of each arrival, a point on a load curve, and the questions each mode answers."""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from rnb.load.keys import RunKey
from rnb.load.settings import LoadSettings

# The time-card fields of a stream's frame (timings.parquet's columns): its stream, its index in the stream, when
# it must finish (epoch seconds on the job's clock) and whether it finished later (set at the final step).
STREAM_FIELD, FRAME_FIELD, DEADLINE_FIELD, LATE_FIELD = "stream", "frame", "deadline", "late"
# The time-card field of a request's due time (epoch seconds on the job's clock), for the modes whose exact times
# matter (LoadMode.records_due): a request's enqueue minus it is the client's timing error.
DUE_FIELD = "due"
FATES = ("processed", "dropped", "unfinished")


@dataclass(frozen=True, order=True)
class Arrival:
    """When one request is due, in seconds after the client's start (None: as soon as there is room), and for a
    camera stream's frame, which stream and which frame of it."""

    due_s: float | None
    stream: int | None = None
    frame: int | None = None


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
    records_due: ClassVar[bool] = False  # each card records its request's due time (DUE_FIELD)

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

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        """A mix of values this mode cannot run for -v `videos`: (the key to blame, what was expected); None when
        it can."""
        return None

    def short_of_its_load(self, args: Mapping[str, object], requests: int) -> str | None:
        """Why a logged job that issued `requests` requests (warm-up included) did not measure the load it names, as
        a validity rule's sentence; None when it did.  Most modes offer the same load throughout, so any window
        measures it."""
        return None

    @property
    def saturating(self) -> bool:
        """Whether every request is offered at once, so the load is all the pipeline can take."""
        return False

    def query_size(self, settings: LoadSettings) -> int:
        """How many requests go together, the first of them only once every request before it has finished: 1
        (each on its own) but for LoadGen's multi-stream queries."""
        return 1

    def open_loop(self, settings: LoadSettings) -> bool:
        """Whether requests go at their due times whether or not earlier ones finished, and are all served: a job
        whose requests were served slower than they were offered then measured a growing queue (OVERLOADED_BY)."""
        return False


def logged_number(args: Mapping[str, object], key: str) -> float:
    """A number of a logged job's meta.json `args`; NaN where it has none."""
    value = args.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def logged_seed(args: Mapping[str, object]) -> int:
    """The seed a logged job's client drew its arrivals from (0, the default, where meta.json has none)."""
    seed = logged_number(args, "seed")
    return int(seed) if math.isfinite(seed) else 0
