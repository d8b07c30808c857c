"""rnb-tune --objective streams: the configuration that sustains the most camera streams at F fps.

The throughput search proposes the candidates (its latency bound is the
frames' deadline).  Each is then offered N periodic streams in the
simulation (Arrivals.of_load: rnb.load's own due times), N searched as the
stream search searches it (doubling, then bisection: most_passing); N
passes when every simulated frame finished and at most the bound's fraction
finished later than the deadline after it fell due.  The finalists, most
predicted streams first and then fewer devices, are measured by the stream
search itself on real jobs, and the most streams measured wins.  The
simulation offers every frame, as the queue policy does; the jobs run
under the config's policy.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rnb.analysis.stream_search import StreamSearch, measure_streams, most_passing, search_streams
from rnb.analysis.sweep import RunOutcome, run_benchmark
from rnb.core.records import JsonObject
from rnb.load import LoadSettings
from rnb.tune.estimate import Arrivals, Estimator, simulate
from rnb.tune.profile import write_json_atomic
from rnb.tune.report import BEST
from rnb.tune.search import Search
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
    max_streams: int = 256

    @staticmethod
    def of(space: TuneSpace, fps: float, bound: float, deadline_ms: float | None) -> StreamGoal:
        """The deadline given, else the config's run.deadline_ms, else one frame period (as benchmark.py's)."""
        configured = space.document.get("run", {}).get("deadline_ms")
        chosen = deadline_ms if deadline_ms is not None else configured
        return StreamGoal(fps, bound, float(chosen) if chosen is not None else 1000.0 / fps)

    def load_flags(self, streams: int) -> list[str]:
        return ["--streams", str(streams), "--fps", f"{self.fps:g}", "--deadline-ms", f"{self.deadline_ms:g}"]


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


def predicted_streams(estimator: Estimator, candidate: Candidate, goal: StreamGoal) -> int:
    """The most streams the candidate's simulation sustains; no more than its capacity allows plus one are tried."""
    pipeline = estimator.pipeline(candidate)
    q = 100.0 * (1.0 - goal.bound)   # the frames' percentile that must finish within the deadline
    capacity = pipeline.capacity_per_s()
    most = goal.max_streams if not math.isfinite(capacity) else min(goal.max_streams, int(capacity / goal.fps) + 1)

    def passed(streams: int) -> bool:
        arrivals = Arrivals.of_load(LoadSettings(streams=streams, fps=goal.fps, deadline_ms=goal.deadline_ms),
                                    estimator.seed, estimator.items)
        prediction = simulate(pipeline, arrivals, estimator.items, estimator.seed, (q,), warmup=0)
        return prediction.items == estimator.items and prediction.percentile_ms(q) <= goal.deadline_ms

    return most_passing(passed, max(most, 1))[0]


def stream_finalists(found: Search, goal: StreamGoal, count: int) -> list[StreamFinalist]:
    """The candidates the search predicted, most streams first, then fewer devices; the first `count`."""
    ranked = sorted((StreamFinalist(e.candidate, predicted_streams(found.estimator, e.candidate, goal), e.devices)
                     for e in found.evaluated.values()), key=lambda f: (-f.predicted, f.devices, f.candidate.key))
    return ranked[:count]


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


def write_streams_report(out: Path, space: TuneSpace, goal: StreamGoal, measured: Sequence[MeasuredStreams]) -> str:
    """DIR/streams.json (every finalist, predicted and measured) and, when one sustained a stream, DIR/best.json
    (its config, run at the streams it sustained); the summary printed, one line per finalist, then the best."""
    winner = max(measured, key=lambda m: m.search.best, default=None)
    document: JsonObject = {
        "fps": goal.fps, "bound": goal.bound, "deadline_ms": goal.deadline_ms,
        "finalists": [{"candidate": space.label(m.finalist.candidate), "config": str(m.config_path),
                       "predicted_streams": m.finalist.predicted, "streams": m.search.best, "failed_at": m.search.above,
                       "trials": [{"streams": t.streams, "missed_fraction": t.missed_fraction,
                                   "latency_ms": None if math.isinf(t.latency_ms) else t.latency_ms,
                                   "job_dir": str(t.job_dir)} for t in m.search.trials]} for m in measured],
        "streams": winner.search.best if winner is not None else 0}
    write_json_atomic(out / STREAMS_REPORT, document)
    lines = [f"finalist {i}: {space.short_label(m.finalist.candidate)}  predicted {m.finalist.predicted} streams; "
             f"measured {m.search.best}" + (f" (and not {m.search.above})" if m.search.above is not None else "")
             for i, m in enumerate(measured, start=1)]
    if winner is not None and winner.search.best > 0:
        run = {"streams": winner.search.best, "fps": goal.fps, "deadline_ms": goal.deadline_ms}
        write_json_atomic(out / BEST, space.document_for(
            winner.finalist.candidate, run=run, description=f"rnb-tune best for streams at {goal.fps:g} fps: "
                                                            f"{space.label(winner.finalist.candidate)}"))
        lines.append(f"best: {space.label(winner.finalist.candidate)}: {winner.search.best} streams at {goal.fps:g} fps")
        lines.append(f"wrote {out / BEST}, {out / STREAMS_REPORT}")
    else:
        lines.append(f"wrote {out / STREAMS_REPORT}")
    return "\n".join(lines)
