"""Loads read from outside: a recorded trace replayed exactly, and Poisson following a schedule of rates."""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping

from rnb.load.inputs import TraceError, parse_schedule, read_trace
from rnb.load.keys import RunKey
from rnb.load.mode import Arrival, CurvePoint, LoadMode, logged_number, logged_seed
from rnb.load.settings import LoadSettings

ARRIVALS = RunKey("arrivals", ("--arrivals",), "FILE", "replay a trace: a CSV or Parquet file with a column offset_s "
                  "(seconds from the start, sorted) and optionally stream, or a job's log directory, whose "
                  "enqueue times are replayed (default: off)",
                  text="a CSV or Parquet file of arrival offsets, or a job's log directory")
RATE_SCHEDULE = RunKey("rate_schedule", ("--rate-schedule",), "SPANS",
                       "Poisson at each rate for each span, e.g. 100@10s,300@5s,100@10s (requests/s@seconds), a "
                       "span RATE-RATE@S a linear ramp; repeated until -v requests are sent (default: off)",
                       text="a rate schedule such as \"100@10s,300@5s\"")


class Trace(LoadMode):
    """A recorded load replayed exactly: each request at its offset from the start (and on its stream, if given)."""

    name = "trace"
    records_due = True
    keys = (ARRIVALS,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.arrivals is not None

    def job_label(self, settings: LoadSettings) -> str:
        return "trace"

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        try:
            offsets, _ = read_trace(settings.arrivals or "")
        except TraceError as error:
            return "arrivals", str(error)
        if len(offsets) < videos:
            return "arrivals", (f"expected at least the {videos} requests to finish (-v), found {len(offsets)} arrival "
                                f"times in {settings.arrivals}")
        return None

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        offsets, streams = read_trace(settings.arrivals or "")
        if streams is None:
            yield from (Arrival(offset) for offset in offsets)
            return
        frames: dict[int, int] = {}
        for offset, stream in zip(offsets, streams):
            frames[stream] = frames.get(stream, -1) + 1
            yield Arrival(offset, stream, frames[stream])

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        return CurvePoint(f" (trace {args.get('arrivals')})", 0.0, "trace")

    def open_loop(self, settings: LoadSettings) -> bool:
        return True


class Schedule(LoadMode):
    """Poisson at a rate that follows a schedule of spans (bursts, ramps), repeated until -v requests are sent."""

    name = "schedule"
    keys = (RATE_SCHEDULE,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.rate_schedule is not None

    def job_label(self, settings: LoadSettings) -> str:
        spans = parse_schedule(settings.rate_schedule or "")
        return "sched" + "_".join(f"{s.start:g}" + (f"-{s.end:g}" if s.end != s.start else "") + f"x{s.seconds:g}"
                                  for s in spans)[:60]

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        try:
            parse_schedule(settings.rate_schedule or "")
        except ValueError as error:
            return "rate_schedule", str(error)
        return None

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        spans = parse_schedule(settings.rate_schedule or "")
        rng = random.Random(seed)
        begin = 0.0
        while True:
            for span in spans:
                yield from (Arrival(due) for due in span.arrivals(begin, rng))
                begin += span.seconds

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        return CurvePoint(f" (schedule {args.get('rate_schedule')})", 0.0, "schedule")

    def open_loop(self, settings: LoadSettings) -> bool:
        return True

    def short_of_its_load(self, args: Mapping[str, object], requests: int) -> str | None:
        """The measured requests must cover one whole cycle of the schedule, from the first measured request's due
        time on: a job that stops inside a cycle measured only some of its rates.  The due times are the job's own
        (the schedule and the seed fix them), so the count needed is exact."""
        schedule = str(args.get("rate_schedule"))
        cycle_s = sum(span.seconds for span in parse_schedule(schedule))
        warmup = int(logged_number(args, "warmup")) if math.isfinite(logged_number(args, "warmup")) else 0
        due = (arrival.due_s or 0.0 for arrival in self.arrivals(LoadSettings(rate_schedule=schedule), logged_seed(args)))
        first = next(itertools.islice(due, warmup, None))
        needed = warmup + 1 + sum(1 for _ in itertools.takewhile(lambda when: when < first + cycle_s, due))
        if requests >= needed:
            return None
        return (f"the {requests - warmup} measured requests cover less than one cycle of the rate schedule "
                f"{schedule} ({cycle_s:g} s from the first measured one, {needed - warmup} requests).")

