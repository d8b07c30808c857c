"""The job log's meta.json as typed records: written by the engines, read back by the analysis, one schema.

`ProcessRecord` is one entry of `processes`: what a driver knows of a
process at spawn time, completed as it reports and exits.  `GpuRecord` is
one entry of `gpus`: a GPU as NVML described it when the job was checked,
and what the main process held on it (`MainGpuMemory`).  `JobMeta` is the
whole document.  Both are frozen; a driver replaces a record as it learns
more (rnb.engines.job.JobBook).  Reading is lenient where a log (an older
version's, or one written by hand) lacks a field: it reads as its default;
only `num_steps`, without which no table can be read, is required.  A field
of the wrong type is a JobLogError naming the file, in one sentence.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

# A value of a JSON document, as json.loads gives it.
Json: TypeAlias = str | int | float | bool | None | list["Json"] | dict[str, "Json"]
JsonObject: TypeAlias = dict[str, Json]

Role = Literal["client", "runner"]
ROLES: tuple[Role, ...] = ("client", "runner")
# How a process ended: by itself without error, with one (or by dying), stopped by the driver, or never started.
ProcessStatus = Literal["ok", "failed", "killed", "not started"]
STATUSES: tuple[ProcessStatus, ...] = ("ok", "failed", "killed", "not started")

T = TypeVar("T")


class JobLogError(ValueError):
    """A job directory whose files cannot be read as a job log; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ProcessRecord:
    """One process of a job (client or runner) as meta.json's `processes` lists it."""

    name: str
    role: Role
    step: int | None = None
    group: int | None = None
    instance: int | None = None
    device: str | None = None            # "cpu" or "cuda:N"; None for the client
    pid: int | None = None
    exitcode: int | None = None
    status: ProcessStatus | None = None  # None while it runs
    error: str | None = None             # one sentence, when it failed
    peak_rss_bytes: int | None = None
    peak_device_bytes: int | None = None   # torch's allocator peak on its CUDA device
    # NVML's view of the process on its GPU, in all and outside torch's allocator (its CUDA context and
    # library handles); None without a CUDA device or where NVML cannot tell (rnb.pipeline.gpus)
    device_process_bytes: int | None = None
    device_outside_allocator_bytes: int | None = None
    output_device: str | None = None       # where its output slots live ("cuda:N" or "cpu"); None without slots
    threads: int | None = None             # the torch threads the plan gave it; None = torch's default
    intra_op_threads: int | None = None    # what torch ran with, as the process reported at exit
    interop_threads: int | None = None
    node: str | None = None                # the Ray engine's node id, None on the local engine
    node_ip: str | None = None
    gpu_ids: tuple[str, ...] | None = None  # the GPUs Ray gave the actor
    stacks: str | None = None              # its Python stacks when the job stalled: a file relative to the job directory

    @property
    def ended(self) -> bool:
        return self.status is not None

    def to_json(self) -> JsonObject:
        document: JsonObject = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        document["gpu_ids"] = None if self.gpu_ids is None else list(self.gpu_ids)
        return document

    @staticmethod
    def from_json(document: Mapping[str, Json], where: str) -> ProcessRecord:
        name = _required(document, "name", str, where)
        found = _required(document, "role", str, where)
        role = next((known for known in ROLES if known == found), None)
        if role is None:
            raise JobLogError(f"{where}: 'role' should be 'client' or 'runner', found {found!r}.")
        found_status = _optional(document, "status", str, where)
        status = next((known for known in STATUSES if known == found_status), None)
        if found_status is not None and status is None:
            raise JobLogError(f"{where}: 'status' should be one of {', '.join(map(repr, STATUSES))}, "
                              f"found {found_status!r}.")
        gpu_ids = document.get("gpu_ids")

        def integer(key: str) -> int | None:
            return _optional(document, key, int, where)

        def string(key: str) -> str | None:
            return _optional(document, key, str, where)

        return ProcessRecord(
            name=name, role=role, step=integer("step"), group=integer("group"), instance=integer("instance"),
            device=string("device"), pid=integer("pid"), exitcode=integer("exitcode"), status=status,
            error=string("error"), peak_rss_bytes=integer("peak_rss_bytes"),
            peak_device_bytes=integer("peak_device_bytes"), device_process_bytes=integer("device_process_bytes"),
            device_outside_allocator_bytes=integer("device_outside_allocator_bytes"),
            output_device=string("output_device"), threads=integer("threads"),
            intra_op_threads=integer("intra_op_threads"), interop_threads=integer("interop_threads"),
            node=string("node"), node_ip=string("node_ip"),
            gpu_ids=None if not isinstance(gpu_ids, list) else tuple(str(g) for g in gpu_ids), stacks=string("stacks"))


@dataclass(frozen=True)
class MainGpuMemory:
    """What the main process held on one GPU: it allocates every CUDA slot, so it has a context there.

    NVML's two figures are taken while the slots are still allocated (the
    job's own footprint); `slot_bytes` is what the slots themselves take;
    `left_after_release_bytes` is what torch's allocator still reserved there
    once every slot was released, CUDA IPC collected and the cache emptied:
    0 unless a process that received slots died before releasing them.
    """

    device_process_bytes: int | None = None
    device_outside_allocator_bytes: int | None = None
    slot_bytes: int = 0
    left_after_release_bytes: int | None = None

    def to_json(self) -> JsonObject:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @staticmethod
    def from_json(document: Mapping[str, Json], where: str) -> MainGpuMemory:
        return MainGpuMemory(
            device_process_bytes=_optional(document, "device_process_bytes", int, where),
            device_outside_allocator_bytes=_optional(document, "device_outside_allocator_bytes", int, where),
            slot_bytes=_optional(document, "slot_bytes", int, where) or 0,
            left_after_release_bytes=_optional(document, "left_after_release_bytes", int, where))


@dataclass(frozen=True)
class GpuRecord:
    """One GPU a job asked for, as NVML described it when the job was checked (rnb.pipeline.gpus)."""

    logical_index: int              # as written in the config
    physical_index: int             # NVML's index, after CUDA_VISIBLE_DEVICES
    name: str
    uuid: str                       # NVML's, "GPU-..."; torch's for the same logical index was checked equal
    memory_total_bytes: int
    memory_used_bytes: int = 0      # when the job was checked: not 0 only where --allow-busy-gpus let it run
    compute_pids: tuple[int, ...] = ()  # other processes computing on it then, likewise
    main_process: MainGpuMemory | None = None  # None where the main process held no slots on it
    process_query_error: str = ""   # why NVML could not list its compute processes ("" where it could)

    def to_json(self) -> JsonObject:
        document: JsonObject = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        document["compute_pids"] = list(self.compute_pids)
        document["main_process"] = None if self.main_process is None else self.main_process.to_json()
        return document

    @staticmethod
    def from_json(document: Mapping[str, Json], where: str) -> GpuRecord:
        pids = document.get("compute_pids") or []
        main = document.get("main_process")
        return GpuRecord(
            logical_index=_required(document, "logical_index", int, where),
            physical_index=_optional(document, "physical_index", int, where) or 0,
            name=str(document.get("name") or ""), uuid=str(document.get("uuid") or ""),
            memory_total_bytes=_optional(document, "memory_total_bytes", int, where) or 0,
            memory_used_bytes=_optional(document, "memory_used_bytes", int, where) or 0,
            compute_pids=tuple(int(pid) for pid in pids if isinstance(pid, int)) if isinstance(pids, list) else (),
            main_process=MainGpuMemory.from_json(main, f"{where}: main_process") if isinstance(main, dict) else None,
            process_query_error=str(document.get("process_query_error") or ""))


@dataclass(frozen=True)
class JobMeta:
    """meta.json: how a job ran and ended, whatever the engine."""

    job_id: str
    config_path: str
    args: JsonObject                         # the job's settings (rnb.engines.job.RunArgs) as written
    start_time: float | None                 # epoch s when the start barrier passed; None if it never did
    end_time: float | None                   # epoch s when the flag was raised
    finished_items: int
    termination_reason: str
    num_steps: int
    failed_process: str | None = None
    error: str | None = None
    # Items the final step's runners counted as finished (at most -v), as they told the driver: equal to
    # finished_items unless finished items were lost on their way to the log; None where it is not known.
    counted_items: int | None = None
    processes: tuple[ProcessRecord, ...] = ()
    main_peak_rss_bytes: int | None = None   # the main process's own peak, the end-of-run summary included
    versions: Mapping[str, str | None] = field(default_factory=dict)
    host: str = ""
    gpus: tuple[GpuRecord, ...] = ()         # each GPU the job asked for, with what the main process held on it
    notes: tuple[str, ...] = ()
    engine: JsonObject = field(default_factory=lambda: {"name": "local"})
    cuda_device_order: str | None = None     # CUDA_DEVICE_ORDER the job ran with (PCI_BUS_ID: NVML's numbering)
    streams: JsonObject | None = None        # a camera-stream job's frames (rnb.engines.streams.streams_record)
    scenario: str | None = None              # the LoadGen scenario the job ran (--scenario), if any
    # The job judged by its scenario's LoadGen rules (rnb.analysis.loadgen_rules.Verdict.to_json), written after the
    # end-of-run summary; None for a job without a scenario.
    loadgen_rules: JsonObject | None = None

    @property
    def elapsed_s(self) -> float | None:
        return None if self.start_time is None or self.end_time is None else self.end_time - self.start_time

    @property
    def throughput_items_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.finished_items / elapsed if elapsed else 0.0

    def setting(self, name: str, default: T) -> T:
        """One of the job's settings (`args`), or `default` when the log does not hold it."""
        value = self.args.get(name)
        return default if value is None else value  # type: ignore[return-value]

    def to_json(self) -> JsonObject:
        """The document as written: every field, plus the two figures derived from them for readers of the raw file."""
        return {
            "job_id": self.job_id, "config_path": self.config_path, "args": self.args,
            "start_time": self.start_time, "end_time": self.end_time, "elapsed_s": self.elapsed_s,
            "finished_items": self.finished_items, "throughput_items_per_s": self.throughput_items_per_s,
            "termination_reason": self.termination_reason, "failed_process": self.failed_process, "error": self.error,
            "counted_items": self.counted_items,
            "processes": [p.to_json() for p in self.processes], "main_peak_rss_bytes": self.main_peak_rss_bytes,
            "versions": dict(self.versions), "host": self.host, "gpus": [gpu.to_json() for gpu in self.gpus],
            "num_steps": self.num_steps, "notes": list(self.notes), "engine": self.engine,
            "cuda_device_order": self.cuda_device_order,
            **({} if self.streams is None else {"streams": self.streams}),
            **({} if self.scenario is None else {"scenario": self.scenario}),
            **({} if self.loadgen_rules is None else {"loadgen_rules": self.loadgen_rules}),
        }

    @staticmethod
    def from_json(document: Mapping[str, Json], where: str) -> JobMeta:
        """Read a parsed meta.json; `where` (its path) names it in errors."""
        processes = document.get("processes") or []
        if not isinstance(processes, list):
            raise JobLogError(f"{where}: 'processes' should be a list, found {type(processes).__name__}.")
        start, end = document.get("start_time"), document.get("end_time")
        return JobMeta(
            job_id=str(document.get("job_id") or ""),
            config_path=str(document.get("config_path") or ""),
            args=_object(document, "args", where),
            start_time=None if start is None else _number(start, "start_time", where),
            end_time=None if end is None else _number(end, "end_time", where),
            finished_items=_optional(document, "finished_items", int, where) or 0,
            termination_reason=_optional(document, "termination_reason", str, where) or "",
            num_steps=_required(document, "num_steps", int, where),
            failed_process=_optional(document, "failed_process", str, where),
            error=_optional(document, "error", str, where),
            counted_items=_optional(document, "counted_items", int, where),
            processes=tuple(ProcessRecord.from_json(p, f"{where}: processes[{i}]") if isinstance(p, dict) else
                            _wrong(f"{where}: processes[{i}]", "an object", p) for i, p in enumerate(processes)),
            main_peak_rss_bytes=_optional(document, "main_peak_rss_bytes", int, where),
            versions={str(k): None if v is None else str(v) for k, v in _object(document, "versions", where).items()},
            host=str(document.get("host") or ""),
            gpus=tuple(GpuRecord.from_json(g, f"{where}: gpus[{i}]") for i, g in enumerate(_list(document, "gpus", where))
                       if isinstance(g, dict)),
            notes=tuple(str(n) for n in _list(document, "notes", where)),
            engine=_object(document, "engine", where) or {"name": "local"},
            cuda_device_order=_optional(document, "cuda_device_order", str, where),
            streams=_object(document, "streams", where) or None,
            scenario=_optional(document, "scenario", str, where),
            loadgen_rules=_object(document, "loadgen_rules", where) or None,
        )


def json_at(document: Json, *path: str | int) -> Json:
    """The value at a path of object keys and list indices, such as ("pipeline", 0, "model"); None where there is none."""
    for key in path:
        if isinstance(key, str) and isinstance(document, dict):
            document = document.get(key)
        elif isinstance(key, int) and isinstance(document, list) and 0 <= key < len(document):
            document = document[key]
        else:
            return None
    return document


def _required(document: Mapping[str, Json], key: str, kind: type[T], where: str) -> T:
    value = document.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise JobLogError(f"{where}: needs {'an integer' if kind is int else 'a string'} {key!r}, found {value!r}.")
    return value


def _optional(document: Mapping[str, Json], key: str, kind: type[T], where: str) -> T | None:
    return None if document.get(key) is None else _required(document, key, kind, where)


def _number(value: Json, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JobLogError(f"{where}: needs a number {key!r}, found {value!r}.")
    return float(value)


def _object(document: Mapping[str, Json], key: str, where: str) -> JsonObject:
    value = document.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JobLogError(f"{where}: {key!r} should be an object, found {type(value).__name__}.")
    return value


def _list(document: Mapping[str, Json], key: str, where: str) -> Sequence[Json]:
    value = document.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise JobLogError(f"{where}: {key!r} should be a list, found {type(value).__name__}.")
    return value


def _wrong(where: str, expected: str, found: Json) -> ProcessRecord:
    raise JobLogError(f"{where}: should be {expected}, found {type(found).__name__}.")
