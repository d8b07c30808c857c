"""The job log's meta.json as typed records: written by the engines, read back by the analysis, one schema.

`ProcessRecord` is one entry of `processes`: what a driver knows of a
process at spawn time, completed as it reports and exits.  `JobMeta` is the
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
    threads: int | None = None             # the torch threads the plan gave it; None = torch's default
    intra_op_threads: int | None = None    # what torch ran with, as the process reported at exit
    interop_threads: int | None = None
    node: str | None = None                # the Ray engine's node id, None on the local engine
    node_ip: str | None = None
    gpu_ids: tuple[str, ...] | None = None  # the GPUs Ray gave the actor

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
        gpu_ids = document.get("gpu_ids")
        values = {f.name: document.get(f.name) for f in dataclasses.fields(ProcessRecord)
                  if f.name not in ("name", "role", "gpu_ids")}
        return ProcessRecord(name=name, role=role, gpu_ids=None if not isinstance(gpu_ids, list) else
                             tuple(str(g) for g in gpu_ids), **values)  # type: ignore[arg-type]


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
    processes: tuple[ProcessRecord, ...] = ()
    main_peak_rss_bytes: int | None = None   # the main process's own peak, the end-of-run summary included
    versions: Mapping[str, str | None] = field(default_factory=dict)
    host: str = ""
    gpus: tuple[JsonObject, ...] = ()        # rnb.pipeline.gpus.GpuInfo of each GPU used, with `main_process`
    notes: tuple[str, ...] = ()
    engine: JsonObject = field(default_factory=lambda: {"name": "local"})

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
            "processes": [p.to_json() for p in self.processes], "main_peak_rss_bytes": self.main_peak_rss_bytes,
            "versions": dict(self.versions), "host": self.host, "gpus": list(self.gpus), "num_steps": self.num_steps,
            "notes": list(self.notes), "engine": self.engine,
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
            processes=tuple(ProcessRecord.from_json(p, f"{where}: processes[{i}]") if isinstance(p, dict) else
                            _wrong(f"{where}: processes[{i}]", "an object", p) for i, p in enumerate(processes)),
            main_peak_rss_bytes=_optional(document, "main_peak_rss_bytes", int, where),
            versions={str(k): None if v is None else str(v) for k, v in _object(document, "versions", where).items()},
            host=str(document.get("host") or ""),
            gpus=tuple(g for g in _list(document, "gpus", where) if isinstance(g, dict)),
            notes=tuple(str(n) for n in _list(document, "notes", where)),
            engine=_object(document, "engine", where) or {"name": "local"},
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
