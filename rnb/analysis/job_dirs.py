"""Job directories (`<log-dir>/<job_id>/`) found and read from disk, before any statistics.

A job directory holds `config.json`, `meta.json`, `timings.parquet` (one row
per finished item) and, where the job sampled its processes,
`samples.parquet`; a job still running, or killed, has its items in its
spool instead.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rnb.core.joblog import CONFIG_FILE, META_FILE, SAMPLES_FILE, SPOOL_DIR, TIMINGS_FILE, read_json_object, read_meta
from rnb.core.records import JobLogError, JobMeta, JsonObject
from rnb.core.stages import ENQUEUE, StepEvents

JOB_FILES: tuple[str, ...] = (META_FILE, CONFIG_FILE, TIMINGS_FILE, SPOOL_DIR)


@dataclass(frozen=True)
class Job:
    """One job directory as read from disk, before any statistics."""

    job_id: str
    path: Path
    meta: JobMeta
    config: JsonObject
    timings: pa.Table
    num_steps: int
    samples: pa.Table | None = None   # samples.parquet; None for a job that has none (older logs)


@dataclass(frozen=True)
class IncompleteJob:
    """A job directory without meta.json: its job is still running, or its main process was killed."""

    job_id: str
    path: Path
    spooled_items: int   # finished items its main process had already streamed to disk


def find_job_dirs(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> list[Path]:
    """Resolve each path as a job directory (it holds a job file) or a log directory of jobs.

    Subdirectories of a log directory that hold none of the job files are
    not jobs (e.g. a stray folder) and are skipped; `names` keeps only the job
    ids listed, and each listed id must exist.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise JobLogError(f"{path}: no such log or job directory.")
        if _is_job_dir(path):
            found.append(path)
            continue
        found.extend(sorted(child for child in path.iterdir() if child.is_dir() and _is_job_dir(child)))
    if names is not None:
        by_name = {job.name: job for job in found}
        missing = [name for name in names if name not in by_name]
        if missing:
            raise JobLogError(f"{', '.join(str(p) for p in paths)}: no job named {missing[0]!r}.")
        found = [by_name[name] for name in names]
    if not found:
        raise JobLogError(f"{', '.join(str(p) for p in paths)}: holds no job directories (none has a meta.json).")
    return found


def _is_job_dir(path: Path) -> bool:
    return any((path / name).exists() for name in JOB_FILES)


def is_complete(path: Path) -> bool:
    """Whether a job directory holds meta.json, the last file a job writes, and the timings it wrote before it.

    A log directory that filled up may have taken meta.json but refused the
    timings: the job's items are then in its spool, as a killed job's are.
    """
    return (path / META_FILE).is_file() and (path / TIMINGS_FILE).is_file()


def incomplete_job(path: Path) -> IncompleteJob:
    """What an incomplete job directory holds: the items spooled so far (a part cut short by a kill is skipped)."""
    rows = 0
    for part in sorted((path / SPOOL_DIR).glob("*.parquet")):
        try:
            rows += pq.read_metadata(part).num_rows
        except (OSError, pa.ArrowException):
            continue
    return IncompleteJob(path.name, path, rows)


def read_job(path: str | Path, columns: Callable[[int], Iterable[str]] | None = None) -> Job:
    """Read one job directory; any missing or unreadable file raises JobLogError naming it.

    `columns`, given the number of steps, names the timings columns to read
    besides those every job has (the rest are left on disk): what a caller
    that needs a few columns of a long job holds is those, not every row.
    """
    path = Path(path)
    meta = read_meta(path)
    config = read_json_object(path / CONFIG_FILE)
    timings_path = path / TIMINGS_FILE
    num_steps = meta.num_steps
    try:
        if columns is None:
            timings = pq.read_table(timings_path)
        else:  # a column at a time, on this thread: the reader's buffers for one column at once
            file = pq.ParquetFile(timings_path)
            wanted = ("item_id", "is_warmup", ENQUEUE, *_step_columns(num_steps), *columns(num_steps))
            timings = pa.table({name: file.read(columns=[name], use_threads=False).column(0)
                                for name in dict.fromkeys(wanted) if name in file.schema_arrow.names})
    except (OSError, pa.ArrowException) as exc:
        raise JobLogError(f"{timings_path}: cannot be read as Parquet ({exc}).") from exc
    for column in ("item_id", "is_warmup", ENQUEUE, *_step_columns(num_steps)):
        if column not in timings.column_names:
            raise JobLogError(f"{timings_path}: lacks the column {column!r}.")
    return Job(meta.job_id or path.name, path, meta, config, timings, num_steps, _read_samples(path))


def _read_samples(path: Path) -> pa.Table | None:
    samples_path = path / SAMPLES_FILE
    if not samples_path.is_file():
        return None
    try:
        return pq.read_table(samples_path)
    except (OSError, pa.ArrowException) as exc:
        raise JobLogError(f"{samples_path}: cannot be read as Parquet ({exc}).") from exc


def _step_columns(num_steps: int) -> list[str]:
    return [name for k in range(num_steps) for name in StepEvents(k).always]
