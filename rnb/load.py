"""Load modes: how requests arrive, each mode declared once.

A load mode is one class here.  It declares the run keys that choose and
tune it (each a flag of benchmark.py and a key of a config's "run" object,
with its range), names itself in the job id, generates its arrival times,
and tells the analysis where its jobs go on a load curve.  The command line
(rnb.cli), the config's checks (rnb.pipeline.config), the job's settings
(rnb.engines.job.RunArgs), the client (rnb.engines.client) and the analysis
(rnb.analysis) read these declarations instead of keeping lists of their
own; docs/development.md says how to add a mode.

This module imports only rnb.flags and rnb.load_inputs (what a trace and a
schedule are read from), so that every layer may import it.
"""
from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import rnb.flags as flags
from rnb.load_inputs import MAX_STREAMS, MAX_WAIT_S, TraceError, parse_schedule, read_trace
from rnb.load_inputs import OFFERED_FILE as OFFERED_FILE  # the engines and the analysis read these through rnb.load
from rnb.load_inputs import Span as Span

# The largest count a POSIX semaphore holds (SEM_VALUE_MAX on Linux): the bound of every queue and of the
# closed loop's requests in flight.
MAX_SEMAPHORE_VALUE = 2**31 - 1

# The time-card fields of a stream's frame (timings.parquet's columns): its stream, its index in the stream, when
# it must finish (epoch seconds on the job's clock) and whether it finished later (set at the final step).
STREAM_FIELD, FRAME_FIELD, DEADLINE_FIELD, LATE_FIELD = "stream", "frame", "deadline", "late"
# The time-card field of a request's due time (epoch seconds on the job's clock), for the modes whose exact times
# matter (LoadMode.records_due): a request's enqueue minus it is the client's timing error.
DUE_FIELD = "due"
FATES = ("processed", "dropped", "unfinished")

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
    maximum: float | None = None        # the value may reach it (an integer for an integer key)
    above: bool = False                 # the value must exceed `minimum`, not merely reach it
    choices: tuple[str, ...] = ()       # a choice key: one of these strings
    text: str = ""                      # a text key: what its string names ("a trace file ..."); its mode checks it
    needs: str | None = None            # a key that must be set for this one to mean anything

    @property
    def expected(self) -> str:
        """What the key accepts, as an error sentence says it after `expected`."""
        if self.choices:
            return "one of " + ", ".join(f'"{choice}"' for choice in self.choices)
        if self.text:
            return self.text
        if self.integral:
            return (f"an integer >= {self.minimum:g}" if self.maximum is None
                    else f"an integer from {self.minimum:g} to {int(self.maximum)}")
        if self.maximum is None:
            return f"a number {'>' if self.above else '>='} {self.minimum:g}"
        return (f"a number > {self.minimum:g} and <= {self.maximum:g}" if self.above
                else f"a number from {self.minimum:g} to {self.maximum:g}")

    def accepts(self, value: object) -> bool:
        """Whether a value from JSON or a parsed flag is in this key's range."""
        if self.choices:
            return isinstance(value, str) and value in self.choices
        if self.text:
            return isinstance(value, str) and bool(value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integral and not isinstance(value, int)):
            return False
        return (math.isfinite(value) and value >= self.minimum and not (self.above and value == self.minimum)
                and (self.maximum is None or value <= self.maximum))

    def parse(self, text: str) -> Setting:
        """The argparse type of this key's flag: its value, or ArgumentTypeError in the project's words."""
        if self.choices or self.text:
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
    streams: int | None = None
    fps: float = 30.0
    stream_phase: str = "spread"
    jitter_ms: float = 0.0
    deadline_ms: float | None = None    # None: one frame period, 1000 / fps
    stream_policy: str = "queue"
    arrivals: str | None = None         # a trace: a CSV or Parquet file of offsets, or a job's log directory
    rate_schedule: str | None = None    # "100@10s,300@5s" or ramps "100-300@10s": requests/s for each span
    scenario: str | None = None         # a LoadGen scenario's name (SCENARIOS): its load, and its rules for the verdict
    samples_per_query: int = 8          # multi-stream: samples issued together, the next query once all are done
    target_latency_ms: float | None = None   # None: the scenario's LoadGen default (Scenario.target_latency_ms)
    min_duration_ms: float = 10000.0    # a scenario's minimum duration, LoadGen's min_duration_ms (its default)
    client: str = "rnb"                 # who issues the requests: RnB's client, or MLPerf LoadGen ("loadgen")

    @property
    def scenario_target_ms(self) -> float | None:
        """The scenario's target latency: --target-latency-ms, else LoadGen's default for it (None for offline)."""
        spec = SCENARIOS.get(self.scenario or "")
        return self.target_latency_ms if self.target_latency_ms is not None or spec is None else spec.target_latency_ms

    @property
    def deadline_s(self) -> float:
        """How long after its due time a stream's frame may finish and not be late."""
        return (1000.0 / self.fps if self.deadline_ms is None else self.deadline_ms) / 1000.0


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


MEAN_INTERVAL = RunKey("mean_interval_ms", flags.MEAN_INTERVAL, "MS", "Poisson mean inter-arrival in ms; 0 = bulk (default 3)",
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
        size = _number(args, key)
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
        interval = _number(args, "mean_interval_ms")
        return CurvePoint("", -interval, f"mi {interval:g}")

    def open_loop(self, settings: LoadSettings) -> bool:
        return True


STREAMS = RunKey("streams", ("--streams",), "N", "camera streams: N periodic sources of one request each per "
                 f"frame period, at most {MAX_STREAMS} (default: off)", integral=True, minimum=1, maximum=MAX_STREAMS)
# A frame period of at most a day, written as the frame rate of a day's period rounded up to 3 digits.
FPS = RunKey("fps", ("--fps",), "F", "frames per second of each stream (default 30)", minimum=float(f"{1 / MAX_WAIT_S:.3g}"),
             needs="streams")
STREAM_PHASE = RunKey("stream_phase", ("--stream-phase",), "PHASE",
                      "when in the frame period each stream issues: spread (stream s at s/(N F)), aligned (all at "
                      "once) or random (default spread)", choices=("spread", "aligned", "random"), needs="streams")
JITTER = RunKey("jitter_ms", ("--jitter-ms",), "MS", "each frame issued up to MS ms after its time, "
                "uniformly at random; below the frame period (default 0)", needs="streams")
DEADLINE = RunKey("deadline_ms", ("--deadline-ms",), "MS", "a frame finishing later than MS ms "
                  "after its time is late (default: the frame period, 1000/F)", minimum=0, above=True,
                  maximum=MAX_WAIT_S * 1000, needs="streams")
STREAM_POLICY = RunKey("stream_policy", ("--stream-policy",), "POLICY",
                       "queue: every frame is processed; drop: a newer frame replaces the one a stream has waiting "
                       "(default queue)", choices=("queue", "drop"), needs="streams")


class Streams(LoadMode):
    """N cameras at F frames per second: stream s issues frame k at k/F plus its phase (and jitter)."""

    name = "streams"
    records_due = True
    keys = (STREAMS, FPS, STREAM_PHASE, JITTER, DEADLINE, STREAM_POLICY)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.streams is not None

    def job_label(self, settings: LoadSettings) -> str:
        policy = "-drop" if settings.stream_policy == "drop" else ""
        return f"s{settings.streams}-fps{settings.fps:g}{policy}"

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        period_ms = 1000.0 / settings.fps
        if settings.jitter_ms >= period_ms:
            return "jitter_ms", (f"expected a jitter below the frame period ({period_ms:g} ms at {settings.fps:g} "
                                 f"fps), found {settings.jitter_ms:g}")
        return None

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        """Every stream's frames in the order they are due; a stream's own frames stay in order, since its jitter
        is below its period."""
        count = settings.streams or 0
        rng = random.Random(seed)
        phases = [self.phase(settings, stream, rng) for stream in range(count)]
        return heapq.merge(*(self._frames(settings, stream, phases[stream], random.Random(f"{seed}:{stream}"))
                             for stream in range(count)))

    @staticmethod
    def phase(settings: LoadSettings, stream: int, rng: random.Random) -> float:
        """When in the frame period stream `stream` issues, in seconds."""
        period = 1.0 / settings.fps
        if settings.stream_phase == "aligned":
            return 0.0
        if settings.stream_phase == "random":
            return rng.uniform(0.0, period)
        return stream * period / (settings.streams or 1)

    @staticmethod
    def _frames(settings: LoadSettings, stream: int, phase: float, rng: random.Random) -> Iterator[Arrival]:
        jitter = settings.jitter_ms / 1000.0
        frame = 0
        while True:
            offset = rng.uniform(0.0, jitter) if jitter else 0.0
            yield Arrival(phase + frame / settings.fps + offset, stream, frame)
            frame += 1

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        streams = _number(args, "streams")
        policy = args.get("stream_policy") or "queue"   # queue and drop are two loads: a curve each
        return CurvePoint(f" (streams at {_number(args, 'fps'):g} fps, {policy})", streams, f"s {streams:g}")

    def open_loop(self, settings: LoadSettings) -> bool:
        """Under the drop policy a stream's frames wait for the pipeline: what it dropped is its figure, not a queue."""
        return settings.stream_policy == "queue"


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
        warmup = int(_number(args, "warmup")) if math.isfinite(_number(args, "warmup")) else 0
        due = (arrival.due_s or 0.0 for arrival in self.arrivals(LoadSettings(rate_schedule=schedule), logged_seed(args)))
        first = next(itertools.islice(due, warmup, None))
        needed = warmup + 1 + sum(1 for _ in itertools.takewhile(lambda when: when < first + cycle_s, due))
        if requests >= needed:
            return None
        return (f"the {requests - warmup} measured requests cover less than one cycle of the rate schedule "
                f"{schedule} ({cycle_s:g} s from the first measured one, {needed - warmup} requests).")


@dataclass(frozen=True)
class Scenario:
    """One of MLPerf LoadGen's scenarios: its name there, what it issues, and the defaults LoadGen judges it by.

    The percentile is the one LoadGen reports and early stopping bounds (its
    TestSettings defaults); the target latency is Server's bound
    (server_target_latency_ns) and, for the stream scenarios, the latency
    LoadGen expects (single_stream_expected_latency_ns,
    multi_stream_expected_latency_ns), which only sizes its schedule.
    """

    name: str                          # as --scenario spells it
    loadgen: str                       # mlperf_loadgen.TestScenario's member
    percentile: float                  # 0.99 is 99th
    target_latency_ms: float | None    # LoadGen's default; None: Offline has none

    def sets(self, settings: LoadSettings) -> dict[str, Setting]:
        """The load keys the scenario gives RnB's client (docs/running.md puts LoadGen's definitions beside them)."""
        sets: dict[str, dict[str, Setting]] = {"offline": {"mean_interval_ms": 0}, "single-stream": {"concurrency": 1},
                                               "multi-stream": {"concurrency": settings.samples_per_query}}
        return sets.get(self.name, {})


SCENARIOS: dict[str, Scenario] = {spec.name: spec for spec in (
    Scenario("offline", "Offline", 0.99, None), Scenario("server", "Server", 0.99, 100.0),
    Scenario("single-stream", "SingleStream", 0.90, 1.0), Scenario("multi-stream", "MultiStream", 0.99, 8.0))}
SCENARIO = RunKey("scenario", ("--scenario",), "NAME",
                  "a LoadGen scenario, issued and judged by LoadGen's rules: offline (-mi 0), server (Poisson at -mi), "
                  "single-stream (one request at a time), multi-stream (queries of --samples-per-query requests in "
                  "lockstep) (default: none, RnB's own verdict)", choices=tuple(SCENARIOS))
SAMPLES_PER_QUERY = RunKey("samples_per_query", ("--samples-per-query",), "N",
                           "multi-stream: requests in each query, issued together, the next query once all of them "
                           "finished (default 8, LoadGen's)", integral=True, minimum=1, maximum=MAX_SEMAPHORE_VALUE,
                           needs="scenario")
TARGET_LATENCY = RunKey("target_latency_ms", ("--target-latency-ms",), "MS",
                        "server: the bound on the scenario's p99 latency (default 100, LoadGen's "
                        "server_target_latency); single-stream, multi-stream: the latency LoadGen expects, which "
                        "sizes its schedule (defaults 1 and 8, LoadGen's)", minimum=0, above=True,
                        maximum=MAX_WAIT_S * 1000, needs="scenario")
MIN_DURATION = RunKey("min_duration_ms", ("--min-duration-ms",), "MS",   # at most a day: LoadGen issues until it passes
                      "a scenario's minimum duration (default 10000, LoadGen's min_duration_ms)",
                      maximum=MAX_WAIT_S * 1000, needs="scenario")
CLIENT = RunKey("client", ("--client",), "NAME", "who issues the scenario's requests: rnb (this harness's client) or "
                "loadgen (MLPerf LoadGen itself, pip install '.[loadgen]') (default rnb)", choices=("rnb", "loadgen"),
                needs="scenario")
SCENARIO_KEYS = (SCENARIO, SAMPLES_PER_QUERY, TARGET_LATENCY, MIN_DURATION, CLIENT)


class MultiStream(ClosedLoop):
    """LoadGen's MultiStream: a query of N requests at once, the next query only when all N have finished (a closed
    loop of N whose room is taken a whole query at a time)."""

    name = "multi_stream"
    keys = (SAMPLES_PER_QUERY,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.scenario == "multi-stream"

    def job_label(self, settings: LoadSettings) -> str:
        return f"ms{settings.samples_per_query}"

    curve = (" (multi-stream)", "samples_per_query", "ms")

    def query_size(self, settings: LoadSettings) -> int:
        return settings.samples_per_query


class LoadGenDriven(LoadMode):
    """MLPerf LoadGen issues the requests of its scenario itself (rnb.engines.loadgen): none of RnB's modes applies."""

    name = "loadgen"
    keys = (CLIENT,)
    # What a LoadGen-driven job reads besides the scenario's own keys; -mi only as Server's target rate.
    reads = ("mean_interval_ms",)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.client == "loadgen"

    def job_label(self, settings: LoadSettings) -> str:
        spec = SCENARIOS[settings.scenario or "server"]
        rate = f"-mi{settings.mean_interval_ms:g}" if spec.name == "server" else ""
        size = f"{settings.samples_per_query}" if spec.name == "multi-stream" else ""
        return f"lg-{spec.loadgen.lower()}{size}{rate}"

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        if settings.scenario == "server" and settings.mean_interval_ms <= 0:
            return "mean_interval_ms", ("expected a mean gap > 0 ms, LoadGen's Server target rate being 1000 / -mi, "
                                        f"found {settings.mean_interval_ms:g}")
        return None

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        """LoadGen keeps its schedule to itself: the requests have no due times of RnB's."""
        while True:
            yield Arrival(None)

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        interval = _number(args, "mean_interval_ms")
        return CurvePoint(f" (LoadGen {args.get('scenario')})", -interval, f"lg mi {interval:g}")


# Asked in this order: the first mode whose `chosen` says yes is the job's.
MODES: tuple[LoadMode, ...] = (LoadGenDriven(), Streams(), Trace(), Schedule(), MultiStream(), ClosedLoop(), Bulk(),
                               Poisson())
# The keys that each choose a mode of their own: at most one may be set.
EXCLUSIVE = ("streams", "arrivals", "rate_schedule", "concurrency")
# Every load key once, in LoadSettings' order: flags, run keys and LoadSettings fields.
_DECLARED = {**{key.name: key for key in SCENARIO_KEYS}, **{key.name: key for mode in MODES for key in mode.keys}}
LOAD_KEYS: dict[str, RunKey] = {field.name: _DECLARED[field.name] for field in dataclasses.fields(LoadSettings)}
DEFAULTS: dict[str, Setting] = dataclasses.asdict(LoadSettings())


def mode_of(settings: LoadSettings) -> LoadMode:
    """The job's load mode."""
    return next(mode for mode in MODES if mode.chosen(settings))


def with_scenario(settings: LoadSettings, given: Iterable[str]) -> LoadSettings:
    """The settings with their scenario's keys set where the command line and the config left them to defaults
    (for RnB's client: LoadGen issues a LoadGen-driven job's requests itself)."""
    spec = SCENARIOS.get(settings.scenario or "")
    if spec is None or settings.client == "loadgen":
        return settings
    chosen = spec.sets(settings)
    return _settings({**dataclasses.asdict(settings), **{key: value for key, value in chosen.items() if key not in set(given)}})


def refusal(settings: LoadSettings, given: Iterable[str], videos: int) -> tuple[str, str] | None:
    """What is wrong with a job's load settings, if anything: (the key to blame, what was expected).

    `given` are the keys the command line or the config set; a key that
    means something only beside another (--fps beside --streams) is refused
    alone, rather than silently ignored.
    """
    given = list(given)
    for name in given:
        needed = LOAD_KEYS[name].needs
        if needed is not None and getattr(settings, needed) is None:
            return name, (f"expected {flags.flag_name(LOAD_KEYS[needed].spellings)} (or run.{needed}) beside it, "
                          "found none")
    problem = _scenario_refusal(settings, given, videos)
    if problem is not None:
        return problem
    chosen = [name for name in EXCLUSIVE if getattr(settings, name) is not None]
    if len(chosen) > 1:
        return chosen[0], f"expected one load mode, found {' and '.join(_flag(name) for name in chosen)} together"
    return mode_of(settings).refusal(settings, videos)


def _scenario_refusal(settings: LoadSettings, given: list[str], videos: int) -> tuple[str, str] | None:
    """A scenario's own refusals: keys it does not read, keys it contradicts, a -v it cannot split into queries."""
    spec = SCENARIOS.get(settings.scenario or "")
    if spec is None:
        return None
    if settings.client == "loadgen":
        stray = [name for name in given if name in (*EXCLUSIVE, *LoadGenDriven.reads)
                 and not (name == "mean_interval_ms" and spec.name == "server")]
        if stray:
            return stray[0], (f"expected none beside --client loadgen, whose {spec.name} scenario LoadGen issues itself"
                              f", found {_flag(stray[0])}")
    for key, value in spec.sets(settings).items():
        if settings.client == "rnb" and getattr(settings, key) != value:
            return "scenario", (f"expected {_flag(key)} {value} or none beside it (the {settings.scenario} scenario), "
                                f"found {_flag(key)} {getattr(settings, key)}")
    if "samples_per_query" in given and spec.name != "multi-stream":
        return "samples_per_query", f"expected the multi-stream scenario beside it, found {spec.name}"
    if "target_latency_ms" in given and spec.target_latency_ms is None:
        return "target_latency_ms", f"expected a scenario with a latency target beside it, found {spec.name}"
    if spec.name == "multi-stream" and videos % settings.samples_per_query:
        blamed = "samples_per_query" if "samples_per_query" in given else "scenario"
        return blamed, (f"expected -v to be whole queries of {settings.samples_per_query} requests "
                        f"({_flag('samples_per_query')}), found -v {videos}")
    return None


def _flag(name: str) -> str:
    return flags.flag_name(LOAD_KEYS[name].spellings)


def logged_mode(args: Mapping[str, object]) -> LoadMode:
    """The load mode of a logged job, from the load keys of its meta.json `args` (or of an analyze.py row).

    The keys decide, as they did for the job; `load_mode`, which meta.json
    also holds, is for a reader, and a log from before it was written has none.
    """
    return mode_of(logged_settings(args))


def logged_settings(args: Mapping[str, object]) -> LoadSettings:
    """The load settings of a logged job, from the load keys of its meta.json `args`: what its client offered."""
    return _settings({key: args[key] for key in DEFAULTS if args.get(key) is not None})


def logged_seed(args: Mapping[str, object]) -> int:
    """The seed a logged job's client drew its arrivals from (0, the default, where meta.json has none)."""
    seed = _number(args, "seed")
    return int(seed) if math.isfinite(seed) else 0


def _settings(values: Mapping[str, object]) -> LoadSettings:
    """LoadSettings from values by key, each already checked against its RunKey (or read from a log written so)."""
    return LoadSettings(**values)  # type: ignore[arg-type]


def _number(args: Mapping[str, object], key: str) -> float:
    value = args.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan
