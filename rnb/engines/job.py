"""The ends of a job that every engine shares: its settings, how it ended, and its log written.

Each engine's driver (rnb.engines.local.driver, rnb.engines.ray.driver)
opens the job's log directory with `open_job_dir`, runs the job its own way,
and hands how it ended (`JobEnding`) to `close_job`, which writes
timings.parquet and meta.json the same way for both.  The end-of-run summary
is the command line's business (rnb.cli), read back from the written log.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rnb.core import joblog
from rnb.core.messages import Failed, Offered, Ready, Status
from rnb.core.records import GpuRecord, JobMeta, JsonObject, ProcessRecord
from rnb.core.termination import Termination
from rnb.engines.offered import offered_table
from rnb.engines.sampler import DEFAULT_INTERVAL_MS
from rnb.engines.spool import TimingsSpool
from rnb.engines.stopping import STOPS
from rnb.engines.streams import streams_record, write_per_stream
from rnb.load import MAX_SEMAPHORE_VALUE, OFFERED_FILE, LoadSettings, mode_of
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.run_keys import JobSettings

log = logging.getLogger(__name__)

EXIT_CODES = {Termination.TARGET_REACHED: 0, Termination.MAX_DURATION: 0, Termination.INTERRUPTED: 130,
              Termination.TERMINATED: 143}


@dataclass(frozen=True)
class RunArgs(JobSettings):
    """The job's settings after command line, config "run" object and defaults are combined: the run keys'
    (JobSettings, declared with their flags in rnb.pipeline.run_keys), the load's, and the command's own."""

    cpu: bool = False
    log_dir: str = "logs"
    load: LoadSettings = LoadSettings()   # how requests arrive (rnb.load)
    sample_interval_ms: float = DEFAULT_INTERVAL_MS
    ray_address: str | None = None    # --ray-address as given
    quiet: bool = False                # -q: no live progress on stderr (rnb.engines.live)
    request_queue_size: int = field(init=False)  # -qs, or in bulk mode at least -v (see __post_init__)

    def __post_init__(self) -> None:
        # Bulk mode sends every request at once, so the request queue must hold all -v of them whatever -qs
        # says, as RnB sized it; -qs still bounds the inter-step queues.  So does LoadGen's Offline query.
        bulk = mode_of(self.load).saturating or (self.load.client == "loadgen" and self.load.scenario == "offline")
        size = min(max(self.queue_size, self.videos), MAX_SEMAPHORE_VALUE) if bulk else self.queue_size
        object.__setattr__(self, "request_queue_size", size)


def request_queue_note(args: RunArgs) -> str | None:
    """The job-log note of a request queue that bulk mode made larger than -qs."""
    if args.request_queue_size == args.queue_size:
        return None
    return (f"bulk mode (-mi 0): the request queue holds all {args.request_queue_size} requests, more than "
            f"-qs {args.queue_size} (which still bounds the inter-step queues), as RnB sized it")


@dataclass(frozen=True)
class Failure:
    """The first process that failed, and why in one sentence."""

    process: str
    error: str
    sentence: str | None = None   # the job's whole error sentence, where "process X failed: ..." would not say it


class JobBook:
    """What a driver keeps of its job's processes, whatever the engine: their records, who is ready, notes, the first failure.

    Both engines' processes report the same messages (Ready, Failed, Exited:
    rnb.core.messages), so both drivers take them in here; what differs is
    only how each engine learns that a process ended.
    """

    def __init__(self) -> None:
        self._records: dict[str, ProcessRecord] = {}
        self.ready: set[str] = set()
        self.notes: list[str] = []
        self.failure: Failure | None = None
        self.offered: Offered | None = None   # what the client offered, once it told

    def add(self, record: ProcessRecord) -> None:
        self._records[record.name] = record

    def __getitem__(self, name: str) -> ProcessRecord:
        return self._records[name]

    def update(self, name: str, **changes: object) -> ProcessRecord:
        """Replace the named record's fields (ProcessRecord's names); the new record."""
        record = self._records[name] = dataclasses.replace(self._records[name], **changes)  # type: ignore[arg-type]
        return record

    @property
    def records(self) -> tuple[ProcessRecord, ...]:
        """Every record, in the order the processes were added (spawned or created)."""
        return tuple(self._records.values())

    def on_status(self, status: Status) -> None:
        if isinstance(status, Ready):
            self.ready.add(status.name)
            self.notes.extend(note for note in status.notes if note not in self.notes)
        elif isinstance(status, Failed):
            self.update(status.name, status="failed", error=status.error)
            self.first_failure(status.name, status.error)
        elif isinstance(status, Offered):
            self.offered = status
        else:
            self.update(status.name, **{k: v for k, v in dataclasses.asdict(status).items() if k != "name"})

    def first_failure(self, process: str, error: str, sentence: str | None = None) -> None:
        """Keep `process` as the job's failure unless another came first."""
        if self.failure is None:
            self.failure = Failure(process, error, sentence)


@dataclass(frozen=True)
class JobEnding:
    """How a job ended, as its log records it, whatever the engine."""

    start: float | None               # the start barrier passed; None if it never did
    end: float
    reason: Termination
    error: str | None                 # one sentence, for the user and meta.json
    spool: TimingsSpool               # finished items, streamed to disk as they came
    book: JobBook                     # the processes, their notes and the first failure
    engine: JsonObject = field(default_factory=lambda: {"name": "local"})  # meta.json's `engine`
    counted: int | None = None        # items the final step counted (meta.json's counted_items), if known


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    job_dir: Path
    logged: bool = True   # meta.json was written (a full log directory may refuse it)


def open_job_dir(config: PipelineConfig, args: RunArgs) -> Path:
    """The job's new log directory, holding a copy of its config; LogWriteError (one sentence) if it cannot be made.

    From here on a stop (Ctrl-C, SIGTERM) is the job's ending, logged like
    any other (rnb.engines.stopping); one that came before raises Stopped.
    """
    STOPS.hold()
    job = joblog.job_id(time.time(), joblog.config_name(config.path), mode_of(args.load).job_label(args.load),
                        args.videos, args.batch_size, args.queue_size)
    where = Path(args.log_dir) / job
    try:
        job_dir = joblog.create_job_dir(args.log_dir, job)
        where = job_dir / joblog.CONFIG_FILE
        joblog.write_json(where, config.raw)
    except OSError as error:
        raise joblog.LogWriteError(f"{joblog.write_failed(where, error)}, so the job did not start") from None
    return job_dir


def close_job(job_dir: Path, config: PipelineConfig, args: RunArgs, gpus: Sequence[GpuRecord],
              ending: JobEnding) -> JobResult:
    """Write timings.parquet and meta.json, and report the error if any: what was measured is on disk.

    A write the log directory refused (this one's, or one while the job
    ran) is the job's error, in one sentence naming the file, and exit 1.
    """
    ending.spool.close()
    writes = ending.spool.writes
    offered = _offered(job_dir, args, ending)
    failure = ending.book.failure
    streams = _streams(job_dir, config, args, ending, offered)
    if streams is not None:   # every stream's row, which the summary cuts to a screenful
        writes.attempt(job_dir / joblog.STREAMS_FILE, lambda: write_per_stream(job_dir / joblog.STREAMS_FILE, streams))
    error = "; and ".join(filter(None, (ending.error, writes.first))) or None
    meta = JobMeta(
        job_id=job_dir.name, config_path=config.path, args=logged_args(args), start_time=ending.start,
        end_time=ending.end, termination_reason=ending.reason.reason,
        finished_items=ending.spool.rows if ending.spool.logged_rows is None else ending.spool.logged_rows,
        num_steps=len(config.steps), failed_process=failure.process if failure else None, error=error,
        counted_items=ending.counted,
        processes=ending.book.records, main_peak_rss_bytes=joblog.main_peak_rss_bytes(), versions=joblog.versions(),
        host=joblog.host(), gpus=tuple(gpus), notes=(*config.notes, *ending.book.notes), engine=ending.engine,
        cuda_device_order=os.environ.get("CUDA_DEVICE_ORDER"), streams=streams, scenario=args.load.scenario)
    logged = writes.attempt(job_dir / joblog.META_FILE, lambda: joblog.write_meta(job_dir, meta))
    if not logged and writes.first and writes.first not in (error or ""):
        error = "; and ".join(filter(None, (error, writes.first)))
    if error:
        log.error("%s", error)
    return JobResult(1 if writes.first else EXIT_CODES.get(ending.reason, 1), job_dir, logged)


def _offered(job_dir: Path, args: RunArgs, ending: JobEnding) -> pa.Table | None:
    """offered.parquet, written: every request the client offered with its fate; None where the client did not say
    what it offered (it was killed) or the timings were not written."""
    timings = job_dir / joblog.TIMINGS_FILE
    if ending.book.offered is None or not timings.exists():
        return None
    finished = set(pq.read_table(timings, columns=["item_id"]).column("item_id").to_pylist())
    table = offered_table(ending.book.offered, args.load, args.seed, finished)
    path = job_dir / OFFERED_FILE
    return table if ending.spool.writes.attempt(path, lambda: pq.write_table(table, path)) else None


def _streams(job_dir: Path, config: PipelineConfig, args: RunArgs, ending: JobEnding,
             offered: pa.Table | None) -> JsonObject | None:
    """meta.json's `streams` for a camera-stream job whose timings were written; None otherwise."""
    timings = job_dir / joblog.TIMINGS_FILE
    if args.load.streams is None or not timings.exists():
        return None
    elapsed = None if ending.start is None else ending.end - ending.start
    return streams_record(timings, args.load, args.seed, args.videos, len(config.steps), elapsed, offered)


def logged_args(args: RunArgs) -> JsonObject:
    """meta.json's `args`: the settings flat, as analysis reads them, the load's among them with its mode's name."""
    settings = {key: value for key, value in dataclasses.asdict(args).items() if key != "load"}
    return {**settings, **dataclasses.asdict(args.load), "load_mode": mode_of(args.load).name}


def error_sentence(reason: Termination, failure: Failure | None, args: RunArgs, stalled: str | None = None) -> str | None:
    """The job's one error sentence for how it ended; `stalled` is the stall's own (rnb.engines.stall.stall_error)."""
    if reason == Termination.STALLED and stalled:
        return stalled
    if reason == Termination.PROCESS_FAILED and failure:
        return failure.sentence or f"process {failure.process} failed: {failure.error}"
    if reason == Termination.REQUEST_QUEUE_FULL:
        return (f"the request queue was full (capacity {args.request_queue_size}, -qs): the pipeline could not keep up "
                "with the requests")
    if reason == Termination.INTER_STEP_QUEUE_FULL:
        return f"an inter-step queue was full (capacity {args.queue_size}, -qs): a step could not keep up with the one before it"
    return None
