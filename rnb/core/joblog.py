"""The job log: `<log-dir>/<job_id>/` with config.json, meta.json, timings.parquet and samples.parquet.

Its format is what analysis scripts parse, so everything about it lives here,
shared by the engines that write it and the analysis that reads it: the file
names, the job id, the directory, the meta record and the timings table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import resource
import socket
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rnb.core.records import JobLogError, JobMeta, Json, JsonObject
from rnb.core.stages import ENQUEUE, StepEvents
from rnb.core.timecard import ROUTE_COLUMNS, TimeCard

CONFIG_FILE = "config.json"          # the config as given
META_FILE = "meta.json"              # the job's record (rnb.core.records), written last
TIMINGS_FILE = "timings.parquet"     # one row per finished item
SAMPLES_FILE = "samples.parquet"     # CPU, memory and GPU use over time (rnb.engines.sampler)
STREAMS_FILE = "streams.csv"         # a camera-stream job's row per stream, as meta.json's streams.per_stream
SPOOL_DIR = "timings.spool"          # finished items' rows in parts while the job runs (rnb.engines.spool)
STACKS_DIR = "stacks"                # <process>.txt: each process's Python stacks when the job stalled


class LogWriteError(Exception):
    """The job's log could not be written; the message is one sentence naming the file."""


def write_failed(path: Path, error: OSError) -> str:
    """The one sentence for a file of the log that could not be written."""
    code = error.errno or next((int(n) for n in re.findall(r"\[errno (\d+)\]", str(error))), None)  # pyarrow's
    why = os.strerror(code) if code else error.strerror or str(error) or type(error).__name__
    return f"could not write {path} ({why}): the log directory is full or failing"


class LogWrites:
    """A job's writes to its log directory, each tried once; the first that failed, as one sentence.

    A full or failing --log-dir must end the job in order, not in a
    traceback: every write of the main process goes through `attempt`, the
    job stops at the first failure (rnb.core.termination's LOG_FAILED), and
    what could still be written is.
    """

    def __init__(self) -> None:
        self.first: str | None = None

    def attempt(self, path: Path, write: Callable[[], object]) -> bool:
        """Run `write` (which writes `path`); False, and the first failure kept, if it raised OSError."""
        try:
            write()
        except OSError as error:
            if self.first is None:
                self.first = write_failed(path, error)
            return False
        return True


# -b and -qs as the job id leaves them out: at these values they say nothing the config does not.
ID_DEFAULTS = {"batch_size": 1, "queue_size": 50000}
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_NAME_CHARS = 40


def config_name(config_path: str) -> str:
    """A config's short name as job ids and tables show it: its file's stem, made safe for a directory name.

    `config/toy.json` is `toy`; the embedded default (`<default>`) is `default`.
    """
    stem = Path(config_path.strip("<>")).stem if config_path else ""
    return _UNSAFE.sub("_", stem).strip("._-")[:MAX_NAME_CHARS] or "config"


def job_id(start: float, config: str, load: str, videos: int, batch_size: int = ID_DEFAULTS["batch_size"],
           queue_size: int = ID_DEFAULTS["queue_size"]) -> str:
    """Start time, config name and load, so a directory listing reads as a table of runs: `261201_193337-toy-mi2-v200`.

    `load` is the load mode's own label (rnb.load: `mi2`, `c8` for a closed
    loop, which ignores -mi); -b and -qs appear only where they differ from
    their defaults (the batch sizes a pipeline ran with are analyze.py's
    `batch` column).
    """
    stamp = time.strftime("%y%m%d_%H%M%S", time.localtime(start))
    extra = "".join(f"-{flag}{value}" for flag, key, value in (("b", "batch_size", batch_size), ("qs", "queue_size", queue_size))
                    if value != ID_DEFAULTS[key])
    return f"{stamp}-{config}-{load}-v{videos}{extra}"


def create_job_dir(log_dir: str, name: str) -> Path:
    """Make the job directory, suffixing -2, -3, ... rather than mix two jobs in one."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    suffix = 1
    while True:
        path = Path(log_dir) / (name if suffix == 1 else f"{name}-{suffix}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            suffix += 1


def write_json(path: Path, document: Json) -> None:
    """Write a whole document or none: a reader (or a kill) never meets half a file, even when it is rewritten."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def record_after_summary(job_dir: Path, loadgen_rules: JsonObject | None) -> None:
    """Rewrite meta.json with what the end-of-run summary found: the main process's peak memory as it is now, and
    the job judged by its LoadGen scenario's rules (None for a job without one)."""
    write_meta(job_dir, dataclasses.replace(read_meta(job_dir), main_peak_rss_bytes=main_peak_rss_bytes(),
                                            loadgen_rules=loadgen_rules))


def main_peak_rss_bytes() -> int:
    """The peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def versions() -> dict[str, str | None]:
    """Versions read from package metadata, so recording them imports nothing heavy."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "torchvision", "torchcodec"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def host() -> str:
    return socket.gethostname() or os.uname().nodename


def timings_table(cards: Iterable[TimeCard], num_steps: int, warmup: int) -> pa.Table:
    """One row per finished item, in item order; model-set fields become nullable columns.

    Per step: the harness's events, the device, then the route (replica,
    batch, output queue; none on the final step).  Events a model records
    itself and each merged segment's own record (seg{i}_...) follow.
    """
    cards = sorted(cards, key=lambda card: card.item_id)
    columns: dict[str, pa.Array] = {
        "item_id": pa.array([c.item_id for c in cards], pa.int64()),
        "payload": pa.array([c.payload for c in cards], pa.string()),
        "is_warmup": pa.array([c.item_id < warmup for c in cards], pa.bool_()),
        ENQUEUE: pa.array([c.event(ENQUEUE) for c in cards], pa.float64()),
    }
    for k in range(num_steps):
        for name in StepEvents(k).always:
            columns[name] = pa.array([c.event(name) for c in cards], pa.float64())
        for template in ROUTE_COLUMNS[: len(ROUTE_COLUMNS) - (k == num_steps - 1)]:
            name = template.format(k=k)
            kind = pa.string() if template.startswith("device") else pa.int64()
            columns[name] = pa.array([c.route_entry(name) for c in cards], kind)
    # Events a model records itself (e.g. a loader's fetch and decode) follow the harness's own.
    for name in sorted({name for c in cards for name in c.events} - set(columns)):
        columns[name] = pa.array([c.event(name) for c in cards], pa.float64())
    for name in dict.fromkeys(name for c in cards for name in c.per_segment):
        columns[name] = pa.array([c.per_segment.get(name) for c in cards])
    defaults = {"bytes_fetched": pa.int64(), "frames_decoded": pa.int64()}
    extra_names = list(defaults) + sorted({name for c in cards for name in c.fields} - set(defaults))
    for name in extra_names:
        values = [c.fields.get(name) for c in cards]
        columns[name] = pa.array(values, defaults.get(name))
    return pa.table(columns)


def write_timings(job_dir: Path, table: pa.Table) -> None:
    pq.write_table(table, job_dir / TIMINGS_FILE)


def write_meta(job_dir: Path, meta: JobMeta) -> None:
    write_json(job_dir / META_FILE, meta.to_json())


def read_meta(job_dir: Path) -> JobMeta:
    """A job's meta.json as its record; JobLogError naming the file if it is missing or not one."""
    path = job_dir / META_FILE
    return JobMeta.from_json(read_json_object(path), str(path))


def read_json_object(path: Path) -> JsonObject:
    """A job log's JSON file that must hold an object (meta.json, config.json); JobLogError naming it otherwise."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise JobLogError(f"{path}: missing.") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise JobLogError(f"{path}: cannot be read as JSON ({error}).") from error
    if not isinstance(document, dict):
        raise JobLogError(f"{path}: should hold a JSON object.")
    return document
