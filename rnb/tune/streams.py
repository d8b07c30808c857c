"""rnb-tune --objective streams: the configuration that sustains the most camera streams at F fps.

The throughput search proposes the candidates (its latency bound is the
frames' deadline).  Each is then offered N periodic streams in the
simulation (Arrivals.of_load: rnb.load's own due times), N searched as the
stream search searches it (doubling, then bisection: most_passing); N
passes when at most the bound's fraction of the simulated frames were
missed: finished later than the deadline after they fell due, or, under
the config's drop policy, dropped (LeakySimulation).  The finalists, most
predicted streams first and then fewer devices, are measured by the stream
search itself on real jobs, and the most streams measured wins.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from rnb.analysis.stream_search import StreamSearch, measure_streams, most_passing, search_streams
from rnb.analysis.sweep import RunOutcome, run_benchmark
from rnb.load import LoadSettings, mode_of
from rnb.tune.estimate import Estimator
from rnb.tune.profile_cache import write_json_atomic
from rnb.tune.search import Search
from rnb.tune.sim_records import Arrivals, SimPipeline
from rnb.tune.simulation import Simulation
from rnb.tune.space import Candidate, TuneSpace
from rnb.tune.verify import VerifySettings, videos_for

STREAMS_REPORT = "streams.json"
DEFAULT_BOUND = 0.01   # the fraction of frames that may be missed, as bench row S1's search allows


@dataclass(frozen=True)
class StreamGoal:
    """What a candidate must sustain: streams at `fps`, at most `bound` of their frames finishing past the deadline."""

    fps: float
    bound: float
    deadline_ms: float
    policy: str = "queue"   # the config's --stream-policy
    max_streams: int = 256

    @staticmethod
    def of(space: TuneSpace, fps: float, bound: float, deadline_ms: float | None) -> StreamGoal:
        """The deadline given, else the config's run.deadline_ms, else one frame period (as benchmark.py's); the
        config's stream policy."""
        run = space.document.get("run", {})
        chosen = deadline_ms if deadline_ms is not None else run.get("deadline_ms")
        return StreamGoal(fps, bound, float(chosen) if chosen is not None else 1000.0 / fps,
                          str(run.get("stream_policy", "queue")))

    def settings(self, streams: int) -> LoadSettings:
        return LoadSettings(streams=streams, fps=self.fps, deadline_ms=self.deadline_ms, stream_policy=self.policy)

    def load_flags(self, streams: int) -> list[str]:
        return ["--streams", str(streams), "--fps", f"{self.fps:g}", "--deadline-ms", f"{self.deadline_ms:g}",
                "--stream-policy", self.policy]


@dataclass(frozen=True)
class StreamFinalist:
    candidate: Candidate
    predicted: int   # the most streams the simulation sustains
    devices: int


@dataclass(frozen=True)
class MeasuredStreams:
    finalist: StreamFinalist
    config_path: Path
    search: StreamSearch


class LeakySimulation(Simulation):
    """The drop policy in the simulation: a stream's frame still in the request queue when the stream's next frame
    arrives is taken out and never finishes (dropped), so each stream has at most one frame waiting there."""

    def __init__(self, pipeline: SimPipeline, arrivals: Arrivals, streams: Sequence[int], seed: int = 0) -> None:
        super().__init__(pipeline, arrivals, len(streams), 0, seed)
        self.stream_of = tuple(streams)
        self.waiting_of: dict[int, object] = {}   # each stream's newest frame, while it may be in the request queue

    def arrive(self) -> None:
        item, stream = self.sent, self.stream_of[self.sent]
        jobs = self.request_queue.jobs
        older = self.waiting_of.pop(stream, None)
        for index, (job, _producer) in enumerate(jobs):
            if job is older:
                del jobs[index]
                self.done += 1   # it ends here, as a dropped frame counts towards the job's -v
                break
        super().arrive()
        if jobs and jobs[-1][0].items == (item,):   # not taken at once: it waits
            self.waiting_of[stream] = jobs[-1][0]


def simulated_missed_fraction(pipeline: SimPipeline, goal: StreamGoal, streams: int, items: int, seed: int) -> float:
    """The fraction of `items` frames of `streams` streams that the simulation drops or finishes past the deadline."""
    settings = goal.settings(streams)
    arrivals = Arrivals.of_load(settings, seed, items)
    if goal.policy == "drop":
        of_stream = [a.stream or 0 for a in itertools.islice(mode_of(settings).arrivals(settings, seed), items)]
        simulation: Simulation = LeakySimulation(pipeline, arrivals, of_stream, seed)
    else:
        simulation = Simulation(pipeline, arrivals, items, 0, seed)
    simulation.run()
    finished, enqueued = np.array(simulation.finished), np.array(simulation.enqueued)
    late = finished - enqueued > goal.deadline_ms / 1000.0
    return float(np.mean(np.isnan(finished) | late))


def predicted_streams(estimator: Estimator, candidate: Candidate, goal: StreamGoal) -> int:
    """The most streams the candidate's simulation sustains; no more than its capacity allows plus one are tried."""
    pipeline = estimator.pipeline(candidate)
    capacity = pipeline.capacity_per_s()
    most = goal.max_streams if not math.isfinite(capacity) else min(goal.max_streams, int(capacity / goal.fps) + 1)

    def passed(streams: int) -> bool:
        return simulated_missed_fraction(pipeline, goal, streams, estimator.items, estimator.seed) <= goal.bound

    return most_passing(passed, max(most, 1))[0]


def stream_finalists(found: Search, goal: StreamGoal) -> list[StreamFinalist]:
    """Every candidate the search predicted, most streams first, then fewer devices: the finalists are the first."""
    return sorted((StreamFinalist(e.candidate, predicted_streams(found.estimator, e.candidate, goal), e.devices)
                   for e in found.evaluated.values()), key=lambda f: (-f.predicted, f.devices, f.candidate.key))


def measure_finalist(space: TuneSpace, finalist: StreamFinalist, goal: StreamGoal, root: Path,
                     settings: VerifySettings, output: IO[str] | None = None) -> MeasuredStreams:
    """The stream search (sweep.py --streams-bound) on the finalist's config, written out beside its jobs."""
    candidate = finalist.candidate
    config_path = root / "verify-streams" / f"{candidate.key}-{settings.digest}" / "config.json"
    write_json_atomic(config_path, space.document_for(candidate, description=f"rnb-tune finalist: {space.label(candidate)}"))

    def run(streams: int, videos: int | None) -> RunOutcome:
        count = videos if videos is not None else videos_for(streams * goal.fps, settings)
        flags = ["-v", str(count), "--warmup", str(settings.warmup), "--engine", settings.engine, *settings.extra_args]
        return run_benchmark(str(config_path), 0.0, root / "logs" / "verify", flags, timeout_s=settings.timeout_s,
                             output=output, load=goal.load_flags(streams))

    result = search_streams(lambda n: measure_streams(run, n, settings.percentile, settings.rules, settings.max_reruns),
                            lambda trial: trial.missed_fraction <= goal.bound, goal.max_streams)
    return MeasuredStreams(finalist, config_path, result)
