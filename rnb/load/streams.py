"""Camera streams: N periodic sources at F frames per second, each frame due at its time, late past its deadline."""
from __future__ import annotations

import heapq
import random
from collections.abc import Iterator, Mapping

from rnb.load.inputs import MAX_STREAMS, MAX_WAIT_S
from rnb.load.keys import RunKey
from rnb.load.mode import Arrival, CurvePoint, LoadMode, logged_number
from rnb.load.settings import LoadSettings

STREAMS = RunKey("streams", ("--streams",), "N", "camera streams: N periodic sources of one request each per "
                 f"frame period, at most {MAX_STREAMS} (default: off)", integral=True, minimum=1, maximum=MAX_STREAMS)
# A frame period of at most a day, written as the frame rate of a day's period rounded up to 3 digits.
FPS = RunKey("fps", ("--fps",), "F", "frames per second of each stream (default {default:g})",
             minimum=float(f"{1 / MAX_WAIT_S:.3g}"), needs="streams")
STREAM_PHASE = RunKey("stream_phase", ("--stream-phase",), "PHASE",
                      "when in the frame period each stream issues: spread (stream s at s/(N F)), aligned (all at "
                      "once) or random (default {default})", choices=("spread", "aligned", "random"), needs="streams")
JITTER = RunKey("jitter_ms", ("--jitter-ms",), "MS", "each frame issued up to MS ms after its time, "
                "uniformly at random; below the frame period (default {default:g})", needs="streams")
DEADLINE = RunKey("deadline_ms", ("--deadline-ms",), "MS", "a frame finishing later than MS ms "
                  "after its time is late (default: the frame period, 1000/F)", minimum=0, above=True,
                  maximum=MAX_WAIT_S * 1000, needs="streams")
STREAM_POLICY = RunKey("stream_policy", ("--stream-policy",), "POLICY",
                       "queue: every frame is processed; drop: a newer frame replaces the one a stream has waiting "
                       "(default {default})", choices=("queue", "drop"), needs="streams")


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
        streams = logged_number(args, "streams")
        policy = args.get("stream_policy") or "queue"   # queue and drop are two loads: a curve each
        return CurvePoint(f" (streams at {logged_number(args, 'fps'):g} fps, {policy})", streams, f"s {streams:g}")

    def open_loop(self, settings: LoadSettings) -> bool:
        """Under the drop policy a stream's frames wait for the pipeline: what it dropped is its figure, not a queue."""
        return settings.stream_policy == "queue"
