"""Camera-stream benchmarks: S1 (does the stream search find the number worked out by hand?) and S2 (how close to
their due times does the client issue periodic frames?).

S1 runs `sweep.py --streams-bound`'s search on config/streams-example.json,
one step of known cost (AsyncSleep, `ms` per frame, so 1000 / ms frames/s):
the most streams at 30 fps is the largest N with N x 30 x ms < 1000.  The
step sleeps on an emulated device and holds no CPU, and the example's
deadline (250 ms) outlasts a loaded machine's stalls, so the number holds
on a busy machine; one stream more falls behind by a fixed fraction of each
second and passes the deadline within the job (the row's note works it).  S2
runs 8 streams at 30 fps into a step of 1 ms (a pipeline far from busy) and
takes every request's |enqueue - due| from its card.  Each figure is one
search or one job (the note says so).

    python bench/run.py --only S1,S2 [--quick]
"""
from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.common import Effort, Goal, Row, Side
from rnb.analysis.jobs import ValidityRules
from rnb.analysis.stream_search import measure_streams, search_streams
from rnb.analysis.sweep import RunOutcome, run_benchmark
from rnb.core.joblog import TIMINGS_FILE
from rnb.load import DUE_FIELD

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "streams-example.json"
FPS = 30.0
MISSED = 0.01          # the stream search's bound: at most 1% of frames late
S2_STREAMS = 8


@dataclass(frozen=True)
class HandWorked:
    """The example's answer by hand, and the arithmetic a reader checks it by."""

    streams: int
    working: str


def by_hand(config: Path, fps: float, frames: int) -> HandWorked:
    """The most streams at `fps` that the example's one step of `ms` per frame sustains: N x fps x ms < 1000.

    One stream more keeps the step busy more than every second it has, so
    its backlog grows by the excess each second; its frames are late once
    the backlog passes the deadline, which a job of `frames` frames must
    outlast for the search to see it.
    """
    document = json.loads(config.read_text())
    ms = float(document["pipeline"][0]["ms"])
    deadline_ms = float(document["run"]["deadline_ms"])
    streams = math.ceil(1000.0 / (ms * fps)) - 1
    over = streams + 1
    growth_ms = over * fps * ms - 1000.0      # backlog added per second with one stream more
    late_after_s = deadline_ms / growth_ms
    lasts_s = frames / (over * fps)
    working = (f"by hand: {streams} x {fps:g} x {ms:g} ms = {streams * fps * ms:g} ms of work per second (fits); "
               f"{over} streams: {over * fps * ms:g} ms, the backlog grows {growth_ms:g} ms/s and passes the "
               f"{deadline_ms:g} ms deadline after {late_after_s:.2g} s of a {lasts_s:.2g} s job")
    return HandWorked(streams, working)


def s1(effort: Effort, config: Path = EXAMPLE) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="rnb-S1-"))
    videos = effort.pick(400, 1200)

    def run(streams: int, longer: int | None) -> RunOutcome:
        return run_benchmark(str(config), 0.0, work / "logs", ["-v", str(longer or videos), "--warmup", "0", "-q"],
                             load=["--streams", str(streams), "--fps", f"{FPS:g}"])

    result = search_streams(lambda n: measure_streams(run, n, 99.0, ValidityRules(), 3),
                            lambda trial: trial.missed_fraction <= MISSED, 64)
    expected = by_hand(config, FPS, videos)
    trials = ", ".join(f"{t.streams}: {t.missed_fraction:.1%} missed" for t in result.trials)
    return [Row("S1", f"most streams at {FPS:g} fps that sweep.py --streams-bound {MISSED:g} finds on "
                      f"{config.name} / the number worked out by hand", Goal("==", 1.0),
                Side("found", "streams", result.best), Side("by hand", "streams", expected.streams),
                result.best / expected.streams, reps=1,
                note=f"one search, {videos} frames per job; trials {trials}; {expected.working}")]


def s2(effort: Effort) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="rnb-S2-"))
    config = work / "light.json"
    config.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.AsyncSleep", "queue_groups": [{"gpus": [-1]}], "ms": 1}]}))
    frames = S2_STREAMS * int(FPS) * effort.pick(5, 20)
    outcome = run_benchmark(str(config), 0.0, work / "logs", ["-v", str(frames), "--warmup", "0", "-q"],
                            load=["--streams", str(S2_STREAMS), "--fps", f"{FPS:g}"])
    table = pq.read_table(outcome.job_dir / TIMINGS_FILE, columns=["enqueue", DUE_FIELD])
    error_ms = np.abs(table.column("enqueue").to_numpy() - table.column(DUE_FIELD).to_numpy()) * 1e3
    p99 = float(np.percentile(error_ms, 99))
    return [Row("S2", f"the client's timing error: p99 of |actual - due| over all requests at {S2_STREAMS} streams x "
                      f"{FPS:g} fps / 1 ms", Goal("<=", 1.0), Side("p99 error", "ms", p99), Side("bound", "ms", 1.0),
                p99, reps=1, note=f"one job of {frames} frames; median {np.median(error_ms):.3f} ms, "
                                  f"max {error_ms.max():.3f} ms")]
