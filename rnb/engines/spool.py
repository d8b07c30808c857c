"""Finished items' rows on their way to timings.parquet, written in batches while the job runs.

Holding every time card until the job ends costs the main process about
2.5 KB per item (over 1 GB at 200,000 items).  The spool keeps at most one
batch of cards: each full batch (or, at a slow pace, whatever `flush_s`
seconds brought) becomes a sorted Parquet part under `<job_dir>/timings.spool/`,
and closing merges the parts into `timings.parquet` in item order.  The merge
holds one small chunk of each part, the chunks together about one batch
whatever the number of parts, so main's memory stays flat however many items
the job finished.  A main process killed outright leaves its
parts behind: all but the last few seconds of measured items stay on disk,
and analysis counts them for the incomplete job.  A part that cannot be
written (a full log directory) is removed and kept as `writes.first`; the
spool then only holds rows, and the driver ends the job.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rnb.core.joblog import SPOOL_DIR, TIMINGS_FILE, LogWrites, timings_table, write_timings
from rnb.core.timecard import TimeCard

BATCH_ROWS = 4096
FLUSH_S = 10.0
# Parts are merged into one when this many accumulate, so a long slow job never holds too many files open.
MAX_PARTS = 128
# A part's row group, and the fewest rows the merge reads from a part at a time: a reader holds a whole row group,
# and smaller groups cost more in metadata than they save.
PART_GROUP_ROWS = 512


class TimingsSpool:
    """Collects finished items' time cards and streams them to Parquet parts, `batch_rows` at a time."""

    def __init__(self, job_dir: Path, num_steps: int, warmup: int, batch_rows: int = BATCH_ROWS,
                 flush_s: float = FLUSH_S, max_parts: int = MAX_PARTS) -> None:
        self.job_dir = job_dir
        self.dir = job_dir / SPOOL_DIR
        self.num_steps = num_steps
        self.warmup = warmup
        self.batch_rows = batch_rows
        self.flush_s = flush_s
        self.max_parts = max_parts
        self.pending: list[TimeCard] = []
        self.parts: list[Path] = []
        self.rows = 0
        self._written = 0  # parts ever written, for unique names
        self._flushed_at = time.monotonic()
        self.writes = LogWrites()  # the job's writes to its log directory; the first failure ends the job
        self.logged_rows: int | None = None  # rows on disk after close, when the log directory refused some

    def add(self, cards: Iterable[TimeCard]) -> None:
        for card in cards:
            self.pending.append(card)
            self.rows += 1
            if len(self.pending) >= self.batch_rows:
                self._flush()
        if self.pending and time.monotonic() - self._flushed_at >= self.flush_s:
            self._flush()

    def _flush(self) -> None:
        self._flushed_at = time.monotonic()
        if not self.pending or self.writes.first is not None:
            return
        part = self._next_part()
        if not self.writes.attempt(part, lambda: self._write_part(part)):
            part.unlink(missing_ok=True)  # what it holds stays pending; its space goes back
            return
        self.parts.append(part)
        self.pending = []
        if len(self.parts) >= self.max_parts:
            merged = self._next_part()
            if not self.writes.attempt(merged, lambda: merge_sorted_parts(self.parts, merged, self.batch_rows)):
                merged.unlink(missing_ok=True)
                return
            for done in self.parts:
                done.unlink()
            self.parts = [merged]

    def _write_part(self, part: Path) -> None:
        self.dir.mkdir(exist_ok=True)
        pq.write_table(timings_table(self.pending, self.num_steps, self.warmup), part, row_group_size=PART_GROUP_ROWS)

    def _next_part(self) -> Path:
        self._written += 1
        return self.dir / f"part-{self._written:06d}.parquet"

    def close(self) -> Path:
        """Write timings.parquet (every row, in item order) and remove the parts; returns its path.

        After a failed write it still tries once, with what it holds: the
        parts stay (and no half timings.parquet) if that fails too.
        """
        path = self.job_dir / TIMINGS_FILE
        if not self.parts:  # a short job: one table, no merging
            written = self.writes.attempt(path, lambda: write_timings(
                self.job_dir, timings_table(self.pending, self.num_steps, self.warmup)))
            if not written:
                self.logged_rows = 0
        else:
            written = True
            if self.pending:  # the last part, whatever failed before: its rows must not be dropped by the merge
                last = self._next_part()
                written = self.writes.attempt(last, lambda: self._write_part(last))
                if written:
                    self.parts.append(last)
                else:
                    last.unlink(missing_ok=True)
            written = written and self.writes.attempt(path, lambda: merge_sorted_parts(self.parts, path, self.batch_rows))
            if written:
                shutil.rmtree(self.dir)
            else:  # the parts stay, for analysis to count (an INCOMPLETE job)
                self.logged_rows = sum(pq.read_metadata(part).num_rows for part in self.parts)
        if not written:
            path.unlink(missing_ok=True)
        self.pending, self.parts = [], []
        return path


def merge_sorted_parts(parts: list[Path], path: Path, chunk_rows: int) -> None:
    """Merge Parquet parts, each sorted by item_id, into one file sorted by item_id, holding about `chunk_rows` rows.

    Each round reads up to the smallest last item_id among the parts' current
    chunks (the frontier): every row at or below it is already loaded, since
    each part is sorted, so the round's rows can be written in order.  Each
    part's chunk is `chunk_rows` shared among the parts, so memory does not
    grow with their number; rows are written `chunk_rows` at a time, so the
    file's row groups do not shrink with it.  Columns a part lacks (a field no
    item of its batch set) are filled with nulls.
    """
    files = [pq.ParquetFile(part) for part in parts]
    schema = pa.unify_schemas([f.schema_arrow for f in files], promote_options="permissive")
    readers = [_chunks(f, max(PART_GROUP_ROWS, chunk_rows // len(files))) for f in files]
    heads = [next(reader, None) for reader in readers]
    ready: list[pa.Table] = []
    with pq.ParquetWriter(path, schema) as writer:
        while live := [(i, head) for i, head in enumerate(heads) if head is not None]:
            frontier = min(head.column("item_id")[-1].as_py() for _, head in live)
            taken_now = []
            for i, head in live:
                taken = pc.sum(pc.less_equal(head.column("item_id"), frontier)).as_py() or 0
                taken_now.append(_conform(head.slice(0, taken), schema))
                heads[i] = head.slice(taken) if taken < head.num_rows else next(readers[i], None)
            ready.append(pa.concat_tables(taken_now).sort_by("item_id"))
            if sum(table.num_rows for table in ready) >= chunk_rows:
                writer.write_table(pa.concat_tables(ready))
                ready = []
        if ready:
            writer.write_table(pa.concat_tables(ready))


def _chunks(file: pq.ParquetFile, rows: int) -> Iterator[pa.Table]:
    for batch in file.iter_batches(batch_size=rows):
        if batch.num_rows:
            yield pa.Table.from_batches([batch])


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)
