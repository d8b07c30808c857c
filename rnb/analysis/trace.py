"""A job's timeline as Chrome trace-event JSON, for Perfetto's UI and chrome://tracing.

Layout, read top to bottom in the viewer:

    node <host> (one trace process per node)      counter: in flight
      client            enqueue ─┐ one zero-length slice per request
      step0-g0-r0       copy │ inside [fetch, decode] │ slot wait │ copy
      step1-g0-r0       copy │ inside │ copy
    queue: requests → step 0 (one trace process per queue)   counter: depth
      queue             one async slice per item waiting in it

Slices are named by the stage parts of rnb.core.stages, so the trace and
every table speak alike; what a model records itself as `<name>_start` /
`<name>_finish` (a loader's fetch and decode) nests inside its step's inside
slice. Flow arrows follow each item from the client through every queue and
step. A thread track must nest, but an item a model holds (a batch being
filled, segments waiting for their siblings) overlaps the next item's
slices; such an item goes onto the replica's first further lane where it
nests, shown as a track of its own.

Times are whole microseconds after the job's origin (its start, or the first
enqueue if earlier), rounded per event so that nesting survives rounding.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import pyarrow as pa

from rnb.analysis.job_dirs import Job
from rnb.analysis.routing import queue_labels, replicas
from rnb.core.records import Json, JsonObject, ProcessRecord
from rnb.core.stages import COPY, ENQUEUE, INSIDE, QUEUE, SIBLING_WAIT, SLOT_WAIT, StepEvents, model_spans

CATEGORY = "item"
LANE_STRIDE = 1000           # tid of lane j of a process: the process's tid + j * LANE_STRIDE
QUEUE_PID_BASE = 1000        # trace pid of the first queue; nodes count up from 1


class Flow(TypedDict, total=False):
    """An event's part in a flow arrow: the arrow's id, and whether it arrives at the event or leaves it."""

    bind_id: int
    flow_in: bool
    flow_out: bool


class TraceEvent(Flow, total=False):
    """One event of the trace-event format: "X" a complete slice, "b"/"e" an async slice's ends, "C" a counter,
    "M" metadata (names and order of processes and threads)."""

    ph: str
    cat: str
    name: str
    id: str
    pid: int
    tid: int
    ts: int          # microseconds after the job's origin
    dur: int
    args: JsonObject


class Trace(TypedDict):
    """The whole document, as Perfetto's UI and chrome://tracing open it."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: JsonObject


@dataclass
class Slice:
    """One complete slice on a thread track, in microseconds; children nest inside it."""

    name: str
    start: int
    end: int
    args: JsonObject
    flow: Flow = field(default_factory=Flow)
    children: list[Slice] = field(default_factory=list)

    def spans(self) -> Iterator[tuple[int, int]]:
        yield self.start, self.end
        for child in self.children:
            yield from child.spans()


@dataclass
class Lanes:
    """A process's thread tracks: lane 0 is the process itself, further lanes take items that would not nest."""

    tid: int
    lanes: list[list[tuple[int, int]]] = field(default_factory=lambda: [[]])

    def place(self, slices: list[Slice]) -> int:
        """The first lane on which every span of these slices nests with what is there; taken."""
        spans = [span for piece in slices for span in piece.spans()]
        first = min(start for start, _ in spans)
        for index, lane in enumerate(self.lanes):
            lane[:] = [kept for kept in lane if kept[1] > first]   # spans ended before cannot cross ours
            if all(_nests(span, kept) for span in spans for kept in lane):
                lane.extend(spans)
                return index
        self.lanes.append(list(spans))
        return len(self.lanes) - 1


def _nests(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Two spans may share a track when they are disjoint or one holds the other."""
    return a[1] <= b[0] or b[1] <= a[0] or (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1])


def _microseconds(seconds: np.ndarray, origin: float) -> np.ndarray:
    return np.round((seconds - origin) * 1e6)


def bind_id(item: int, step: int, num_steps: int) -> int:
    """The flow of one hop: from the item's previous slice (enqueue, or step k-1's last) into step k."""
    return item * num_steps + step


@dataclass
class Tracks:
    """Where each process, lane and queue lives in the trace, and the metadata that names them."""

    job: Job
    nodes: list[str] = field(default_factory=list)
    threads: dict[str, tuple[int, Lanes, int]] = field(default_factory=dict)   # name -> (pid, lanes, sort)
    queues: dict[str, int] = field(default_factory=dict)                      # label -> pid

    def __post_init__(self) -> None:
        processes = self.processes()
        self.nodes = sorted({self.node(p) for p in processes} or {self.node(None)})
        ordered = sorted(processes, key=lambda p: (p.role != "client", p.step or 0, p.group or 0, p.instance or 0))
        for process in ordered:
            self.thread(process.name, process)

    def processes(self) -> tuple[ProcessRecord, ...]:
        return self.job.meta.processes

    def node(self, process: ProcessRecord | None) -> str:
        return (process.node if process else None) or self.job.meta.host or "local"

    def thread(self, name: str, process: ProcessRecord | None = None) -> tuple[int, Lanes]:
        """The process's node pid and lanes, made on first use (a track for unlogged replicas, too)."""
        if name not in self.threads:
            pid = 1 + self.nodes.index(self.node(process)) if process else 1
            self.threads[name] = (pid, Lanes(len(self.threads) + 1), len(self.threads))
        pid, lanes, _ = self.threads[name]
        return pid, lanes

    def queue(self, label: str) -> int:
        return self.queues.setdefault(label, QUEUE_PID_BASE + len(self.queues))

    def metadata(self) -> list[TraceEvent]:
        events = [_meta("process_name", pid, pid, name=f"node {node}") for pid, node in enumerate(self.nodes, 1)]
        events += [_meta("process_sort_index", pid, pid, sort_index=pid) for pid in range(1, len(self.nodes) + 1)]
        for name, (pid, lanes, sort) in self.threads.items():
            for lane in range(len(lanes.lanes)):
                tid = lanes.tid + lane * LANE_STRIDE
                label = name if lane == 0 else f"{name} (held items, lane {lane})"
                events += [_meta("thread_name", pid, tid, name=label),
                           _meta("thread_sort_index", pid, tid, sort_index=sort * LANE_STRIDE + lane)]
        for label, pid in self.queues.items():
            events += [_meta("process_name", pid, pid, name=f"queue: {label}"),
                       _meta("process_sort_index", pid, pid, sort_index=pid)]
        return events


def _meta(kind: str, pid: int, tid: int, **args: Json) -> TraceEvent:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


class Timeline:
    """The job's rows in trace microseconds, with who ran each item at each step and where it queued."""

    def __init__(self, job: Job) -> None:
        table = job.timings
        self.job = job
        seconds = {name: table.column(name).to_numpy(zero_copy_only=False).astype(float)
                   for name in table.column_names if pa.types.is_floating(table.schema.field(name).type)}
        start = job.meta.start_time
        candidates = [float(np.nanmin(seconds[ENQUEUE]))] if table.num_rows else []
        candidates += [start] if start is not None else []
        self.origin = min(candidates, default=0.0)
        self.us = {name: np.round((values - self.origin) * 1e6) for name, values in seconds.items()}
        self.items: list[int] = table.column("item_id").to_pylist()
        self.warmup: list[bool] = table.column("is_warmup").to_pylist()
        self.replicas = [replicas(job, k) for k in range(job.num_steps)]
        self.queues = [queue_labels(job, k, self.replicas[k]) for k in range(job.num_steps)]
        self.model_spans = model_spans(table.column_names)

    def at(self, name: str, row: int) -> int | None:
        value = self.us[name][row] if name in self.us else np.nan
        return None if np.isnan(value) else int(value)


def step_slices(timeline: Timeline, row: int, k: int, args: JsonObject) -> list[Slice] | None:
    """Sibling wait (at a merging step), copy in, inside (with the model's own spans), slot wait and copy out."""
    events = StepEvents(k)
    arrived, started, finished, handed = (timeline.at(name, row) for name in events.always)
    if arrived is None or started is None or finished is None or handed is None:
        return None
    acquired = timeline.at(events.slot_acquired, row)
    num_steps = timeline.job.num_steps
    item = timeline.items[row]
    step_args: JsonObject = {**args, "step": k}
    inside = Slice(INSIDE.name, started, finished, step_args)
    for name in timeline.model_spans:
        begin, end = timeline.at(f"{name}_start", row), timeline.at(f"{name}_finish", row)
        if begin is not None and end is not None and started <= begin <= end <= finished:
            inside.children.append(Slice(name, begin, end, step_args))
    arrival: Flow = {"bind_id": bind_id(item, k, num_steps), "flow_in": True}
    siblings = timeline.at(events.siblings_arrived, row)  # a step that merged the item's segments
    slices = [] if siblings is None else [Slice(SIBLING_WAIT.name, arrived, siblings, step_args, arrival)]
    slices += [Slice(COPY.name, arrived if siblings is None else siblings, started, step_args,
                     arrival if siblings is None else {}), inside]
    if acquired is not None:
        slices.append(Slice(SLOT_WAIT.name, finished, acquired, step_args))
    out = Slice(COPY.name, acquired if acquired is not None else finished, handed, step_args)
    if k + 1 < num_steps:
        out.flow = {"bind_id": bind_id(item, k + 1, num_steps), "flow_out": True}
    return [*slices, out]


def complete_events(slices: list[Slice], pid: int, tid: int) -> list[TraceEvent]:
    events: list[TraceEvent] = []
    for piece in slices:
        events.append({"ph": "X", "cat": CATEGORY, "name": piece.name, "pid": pid, "tid": tid, "ts": piece.start,
                       "dur": piece.end - piece.start, "args": piece.args, **piece.flow})
        events += complete_events(piece.children, pid, tid)
    return events


Placement = tuple[str, list[Slice]]   # a process and one item's slices on it


def item_events(timeline: Timeline, row: int, tracks: Tracks, depth: dict[str, list[tuple[int, int]]],
                placements: list[Placement]) -> list[TraceEvent]:
    """One item's queue waits as events; its enqueue and runner parts go to `placements` for lanes later."""
    item, num_steps = timeline.items[row], timeline.job.num_steps
    args: JsonObject = {"item": item, "warmup": timeline.warmup[row]}
    before = timeline.at(ENQUEUE, row)
    if before is None:
        return []
    placements.append(("client", [Slice(ENQUEUE, before, before, args,
                                        {"bind_id": bind_id(item, 0, num_steps), "flow_out": True})]))
    events: list[TraceEvent] = []
    for k in range(num_steps):
        slices = step_slices(timeline, row, k, args)
        if slices is None:
            break
        label = timeline.queues[k][row]
        pid = tracks.queue(label)
        hop: TraceEvent = {"cat": CATEGORY, "name": QUEUE.name, "id": str(bind_id(item, k, num_steps)), "pid": pid, "tid": pid}
        events.append({**hop, "ph": "b", "ts": before, "args": {**args, "step": k},
                       "bind_id": bind_id(item, k, num_steps), "flow_in": True, "flow_out": True})
        events.append({**hop, "ph": "e", "ts": slices[0].start})
        depth.setdefault(label, []).extend([(before, 1), (slices[0].start, -1)])
        placements.append((timeline.replicas[k][row], slices))
        before = slices[-1].end
    return events


def place_all(tracks: Tracks, placements: list[Placement]) -> list[TraceEvent]:
    """Each item's slices onto a lane of its process, earliest first, so a lane only looks back."""
    events: list[TraceEvent] = []
    for process, slices in sorted(placements, key=lambda placement: placement[1][0].start):
        pid, lanes = tracks.thread(process)
        events += complete_events(slices, pid, lanes.tid + lanes.place(slices) * LANE_STRIDE)
    return events


def counter_events(name: str, pid: int, changes: list[tuple[int, int]]) -> list[TraceEvent]:
    """A counter that steps by each change; several changes at one instant make one sample."""
    events: list[TraceEvent] = []
    level = 0
    times = sorted({when for when, _ in changes})
    by_time: dict[int, int] = dict.fromkeys(times, 0)
    for when, delta in changes:
        by_time[when] += delta
    for when in times:
        level += by_time[when]
        events.append({"ph": "C", "name": name, "pid": pid, "tid": pid, "ts": when, "args": {"items": level}})
    return events


def trace_order(event: TraceEvent) -> tuple[int, int, int]:
    """By time; at one instant a flow's source before its steps and its end, and a parent before its children.

    Viewers read events in this order and bind a flow to the slice it arrives
    on, so the slice a flow leaves must already be known.
    """
    rank = 1
    if "bind_id" in event:
        rank = 0 if not event.get("flow_in") else 2 if not event.get("flow_out") else 1
    return event["ts"], rank, -event.get("dur", 0)


def build_trace(job: Job) -> Trace:
    """The whole trace of one job as a JSON-ready document."""
    timeline = Timeline(job)
    tracks = Tracks(job)
    events: list[TraceEvent] = []
    depth: dict[str, list[tuple[int, int]]] = {}
    in_flight: list[tuple[int, int]] = []
    last = StepEvents(job.num_steps - 1).handed_over
    placements: list[Placement] = []
    for row in range(len(timeline.items)):
        events += item_events(timeline, row, tracks, depth, placements)
        enqueued, done = timeline.at(ENQUEUE, row), timeline.at(last, row)
        if enqueued is not None and done is not None:
            in_flight += [(enqueued, 1), (done, -1)]
    events += place_all(tracks, placements)
    for label, changes in depth.items():
        events += counter_events("depth", tracks.queue(label), changes)
    client_pid, _ = tracks.thread("client")
    events += counter_events("in flight", client_pid, in_flight)
    events.sort(key=trace_order)
    return {"traceEvents": tracks.metadata() + events, "displayTimeUnit": "ms",
            "otherData": {"job_id": job.job_id, "origin_epoch_s": timeline.origin}}


def write_trace(job: Job, path: str | Path) -> None:
    Path(path).write_text(json.dumps(build_trace(job)) + "\n", encoding="utf-8")
