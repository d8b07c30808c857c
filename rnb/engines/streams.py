"""Camera streams (rnb.load.Streams) on the client's side: whose episodes, which frame, when late, what is dropped.

The client issues each stream's frames at their due times (rnb.load);
this module gives each stream its own sequence of episodes, as a camera
has its own, stamps each request's card with its stream, frame and
deadline (and step 0's non_tensors with its stream and frame), and under
`--stream-policy drop` holds the one frame a stream may have waiting,
replacing it by a newer one.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from rnb.core.messages import Request
from rnb.core.records import JsonObject
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.core.termination import POLL_S
from rnb.core.timecard import TimeCard
from rnb.engines.transport_protocols import ClientTransport
from rnb.load import DEADLINE_FIELD, FRAME_FIELD, LATE_FIELD, STREAM_FIELD, LoadSettings, mode_of

# How often a client holding frames looks whether the pipeline took a stream's previous one: a frame period
# is tens of ms, so a look every ms costs at most a few percent of a step-0 runner's time.
HOLD_POLL_S = 0.001


class Dealer:
    """The source's payloads dealt round robin: stream s gets payloads s, s + N, s + 2N, ...

    So a loader sees each stream's consecutive episodes in order, whatever
    the order in which the streams' frames fall due.
    """

    def __init__(self, payloads: Iterator[object], streams: int) -> None:
        self._payloads = payloads
        self._dealt: list[deque[object]] = [deque() for _ in range(streams)]
        self._next = 0   # the stream the next payload from the source goes to

    def next_for(self, stream: int) -> object:
        """Stream `stream`'s next payload; StopIteration when the source ran out first."""
        while not self._dealt[stream]:
            self._dealt[self._next].append(next(self._payloads))
            self._next = (self._next + 1) % len(self._dealt)
        return self._dealt[stream].popleft()


def mark_frame(card: TimeCard, stream: int, frame: int, deadline: float | None) -> None:
    """Stamp a frame's card with its stream, frame index and deadline (epoch seconds on the job's clock), if it has
    one (a replayed trace's streams have none)."""
    card.set_field(STREAM_FIELD, stream)
    card.set_field(FRAME_FIELD, frame)
    if deadline is not None:
        card.set_field(DEADLINE_FIELD, deadline)


def step_zero_non_tensors(request: Request) -> dict[str, object]:
    """What step 0's model receives beside no tensors: the payload, and for a stream's frame its stream and frame
    index too, as a camera's frames carry them (a loader may key its state by stream)."""
    fields = request.card.fields
    marked = {key: fields[key] for key in (STREAM_FIELD, FRAME_FIELD) if key in fields}
    return {"request": request.payload, **marked}


class LeakyStreams:
    """`--stream-policy drop`: each stream has at most one frame held back, and a newer frame replaces it.

    A stream's frame goes to the request queue once the stream's previous
    frame has been taken by a step-0 runner (the request queue is first in,
    first out, so the requests taken so far are the first `submitted -
    waiting`); until then it is held here, and a newer frame of the stream
    drops it.  A dropped frame counts towards -v (`ClientTransport.drop`),
    since -v counts the frames offered.
    """

    def __init__(self, transport: ClientTransport, streams: int) -> None:
        self._transport = transport
        self._held: dict[int, Request] = {}
        self._last = [-1] * streams   # each stream's newest submitted request, by its submission number
        self._submitted = 0
        self.dropped: list[int] = []  # the item ids of the frames dropped, for the log (rnb.core.messages.Offered)

    def offer(self, stream: int, request: Request) -> bool:
        """Hold a new frame, dropping the one its stream held; False once the job ended."""
        if stream in self._held:
            self.dropped.append(self._held[stream].card.item_id)
            if self._transport.drop(1):
                return False
        self._held[stream] = request
        return self.release()

    def release(self) -> bool:
        """Send each held frame whose stream's previous one was taken; False once the job ended."""
        taken = self._submitted - self._transport.waiting()
        for stream in [s for s in self._held if self._last[s] < taken]:
            self._last[stream] = self._submitted
            self._submitted += 1
            if not self._transport.submit(self._held.pop(stream)):
                return False
        return not self._transport.stopped

    def sleep_until(self, due: float) -> bool:
        """Wait to an absolute time, sending held frames as their streams' turns come; False once the job ended."""
        while (left := due - time.time()) > 0:
            if not self.release():
                return False
            time.sleep(min(left, HOLD_POLL_S if self._held else POLL_S))
        return self.release()

    def drain(self) -> None:
        """After the last frame: send what is held as the pipeline takes it, until nothing is or the job ended."""
        while self._held and self.release():
            time.sleep(HOLD_POLL_S)


@dataclass(frozen=True)
class StreamFigures:
    """One stream's frames: offered, processed, late, dropped; its latency percentiles and sustained rate."""

    stream: int
    offered: int
    processed: int
    late: int
    dropped: int
    p50_ms: float | None
    p99_ms: float | None
    fps: float | None   # frames processed per second of the job


def streams_record(timings: Path, settings: LoadSettings, seed: int, videos: int, num_steps: int,
                   elapsed_s: float | None, log: pa.Table | None = None) -> JsonObject:
    """meta.json's `streams`: frames offered, processed, late and dropped, in all and per stream.

    The offered and dropped frames are the client's own (`log`, offered.parquet).  Without it (a client
    killed before it could tell) they are the first -v of the streams'
    arrivals that fell due before the job ended (rnb.load: the times are
    fixed by the settings and the seed), and under the drop policy a frame
    offered and not processed counts as dropped: exact when the job reached
    its target, where every offered frame was processed or dropped.
    Latencies are from enqueue to the final step's hand-over, warm-up
    included.
    """
    count = settings.streams or 0
    offered, dropped = [0] * count, [0] * count
    if log is not None:
        for stream, fate in zip(log.column(STREAM_FIELD).to_pylist(), log.column("fate").to_pylist()):
            offered[stream] += 1
            dropped[stream] += fate == "dropped"
    else:
        for arrival in itertools.islice(mode_of(settings).arrivals(settings, seed), videos):
            if elapsed_s is not None and (arrival.due_s or 0.0) > elapsed_s:
                break
            offered[arrival.stream or 0] += 1
    end = StepEvents(num_steps - 1).handed_over
    table = pq.read_table(timings, columns=[STREAM_FIELD, LATE_FIELD, ENQUEUE, end])
    stream = table.column(STREAM_FIELD).to_numpy(zero_copy_only=False)
    late = table.column(LATE_FIELD).to_numpy(zero_copy_only=False).astype(bool)
    latency_ms = (table.column(end).to_numpy(zero_copy_only=False) - table.column(ENQUEUE).to_numpy(zero_copy_only=False)) * 1e3
    figures = [_one_stream(s, offered[s], dropped[s] if log is not None else None, stream == s, late, latency_ms,
                           settings, elapsed_s) for s in range(count)]
    return {"count": count, "fps": settings.fps, "policy": settings.stream_policy, "deadline_ms": settings.deadline_s * 1e3,
            **{key: sum(getattr(f, key) for f in figures) for key in ("offered", "processed", "late", "dropped")},
            "per_stream": [dataclasses.asdict(f) for f in figures]}


def _one_stream(stream: int, offered: int, dropped: int | None, mine: np.ndarray, late: np.ndarray,
                latency_ms: np.ndarray, settings: LoadSettings, elapsed_s: float | None) -> StreamFigures:
    """One stream's figures; `dropped` as the client counted them, None to count every frame not processed under the
    drop policy."""
    processed = int(mine.sum())
    latencies = latency_ms[mine]
    if dropped is None:
        dropped = max(0, offered - processed) if settings.stream_policy == "drop" else 0
    return StreamFigures(stream, offered, processed, int(late[mine].sum()), dropped,
                         float(np.percentile(latencies, 50)) if processed else None,
                         float(np.percentile(latencies, 99)) if processed else None,
                         processed / elapsed_s if elapsed_s else None)


def write_per_stream(path: Path, record: JsonObject) -> None:
    """The record's row per stream as a CSV file: what a summary too long for a screen leaves out, for a spreadsheet."""
    per_stream = record.get("per_stream")
    rows = per_stream if isinstance(per_stream, list) else []
    columns = [field.name for field in dataclasses.fields(StreamFigures)]
    table = pa.Table.from_pylist([row for row in rows if isinstance(row, dict)],
                                 schema=pa.schema([(name, pa.float64() if name.endswith(("_ms", "fps")) else pa.int64())
                                                   for name in columns]))
    pa_csv.write_csv(table, path)
