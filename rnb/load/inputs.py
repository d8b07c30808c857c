"""What a load mode reads besides numbers: a trace of arrival offsets (`--arrivals`) and a rate schedule's spans.

Both are checked whole before anything starts, and a bad one is refused in
one sentence naming the row (or span) and the value as it was written:
quoted and escaped where it holds characters a terminal would act on (a
control byte of a file that is not text), NaN as NaN, an empty cell or row
as blank.  Their bounds keep a job finishable: no offset, span or gap of
the schedule longer than MAX_WAIT_S, so every due time is finite and no
request is due more than a day after the one before it.

Imports only the standard library and pyarrow (a trace may be Parquet), so
that rnb.load, which every layer imports, stays light.
"""
from __future__ import annotations

import csv
import functools
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# The longest a load may leave the pipeline waiting for its next request: a trace's offset, a span, the mean gap of
# a schedule, a frame period, a Poisson mean interval.  One day: a job asked for more would not finish.
MAX_WAIT_S = 86_400.0
# The most streams a job may have (--streams, and a trace's stream numbers): the client keeps each stream's state
# (a generator and a random state of 2.5 KB), and the log a row per stream.
MAX_STREAMS = 10_000
MAX_RATE = 1e6   # requests/s of a schedule's span: more than any pipeline here takes, so still a bulk load
OFFSET, STREAM = "offset_s", "stream"
# The log of every request a job's client offered (rnb.engines.offered), dropped ones included, and each one's fate:
# what `--arrivals logs/JOB` replays.
OFFERED_FILE = "offered.parquet"
_KINDS = "a CSV or Parquet file of arrival offsets, or a job's log directory"


class TraceError(ValueError):
    """A trace that cannot be replayed; `str()` is what a refusal says after the flag or run key."""


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (control bytes, escapes) shown as Python escapes it."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def shown_cell(cell: object) -> str:
    """A cell of a trace as a refusal quotes it: a blank, NaN, a number as written, anything else quoted."""
    if cell is None or (isinstance(cell, str) and not cell.strip()):
        return "a blank cell"
    if isinstance(cell, float) and math.isnan(cell):
        return "NaN"
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return f"{cell:g}"
    text = str(cell).strip()
    number = _float(text)
    if number is not None and math.isnan(number):
        return "NaN"
    return text if number is not None else repr(text)


@functools.cache
def read_trace(path: str) -> tuple[tuple[float, ...], tuple[int, ...] | None]:
    """A trace's arrival offsets in seconds, sorted, and their streams if it names them; TraceError if unusable.

    A job's log directory gives what its client offered, from its first
    request: every request's due time and stream (OFFERED_FILE), dropped
    ones included; a log without them (an older one, a load without due
    times, a killed client) gives its finished items' enqueue times.
    """
    where = Path(path)
    if where.is_dir():
        return _recorded_job(where)
    header, rows = _table(where)
    if OFFSET not in header:
        raise TraceError(f"expected a column {OFFSET} in {_shown(where)}, found the columns "
                         f"{', '.join(printable(name) for name in header) or 'none'}")
    if not rows:
        raise TraceError(f"expected at least one arrival time in {_shown(where)}, found none")
    offsets = _offsets(where, [row[header.index(OFFSET)] for row in rows])
    if STREAM not in header:
        return offsets, None
    return offsets, _streams(where, [row[header.index(STREAM)] for row in rows])


def _recorded_job(folder: Path) -> tuple[tuple[float, ...], tuple[int, ...] | None]:
    offered = _offered(folder / OFFERED_FILE)
    if offered is None:
        timings = folder / "timings.parquet"
        if not timings.is_file():
            raise TraceError(f"expected a job's log directory holding timings.parquet, found none in {_shown(folder)}")
        enqueue = pq.read_table(timings, columns=["enqueue"]).column("enqueue").to_pylist()
        times = sorted(time for time in enqueue if time is not None)
        offered = tuple(time - times[0] for time in times), None
    offsets = offered[0]
    if offsets and offsets[-1] > MAX_WAIT_S:
        raise TraceError(f"expected a recorded job whose requests came within {MAX_WAIT_S:g} s (one day) of its "
                         f"first, found one {offsets[-1]:g} s after it in {_shown(folder)}")
    return offered


def _offered(path: Path) -> tuple[tuple[float, ...], tuple[int, ...] | None] | None:
    """A job's offered requests as a trace: their due times from the first, and their streams where every one has
    one; None where the file is missing or a request has no due time."""
    if not path.is_file():
        return None
    table = pq.read_table(path, columns=["due", "stream"])
    due, streams = table.column("due").to_pylist(), table.column("stream").to_pylist()
    if not due or any(when is None for when in due):
        return None
    return (tuple(when - due[0] for when in due),
            tuple(streams) if all(stream is not None for stream in streams) else None)


def _table(path: Path) -> tuple[list[str], list[list[object]]]:
    """A trace file's column names and its rows of cells (None for a blank one), from CSV text or Parquet."""
    if not path.is_file():
        raise TraceError(f"expected {_KINDS}, found nothing at {_shown(path)}")
    if path.suffix == ".parquet":
        return _parquet(path)
    return _csv(path)


def _csv(path: Path) -> tuple[list[str], list[list[object]]]:
    try:
        with path.open(newline="", encoding="utf-8") as file:
            lines = list(csv.reader(file))
    except UnicodeDecodeError as error:
        raise TraceError(f"expected {_KINDS}, found {_shown(path)} not UTF-8 text (byte "
                         f"0x{error.object[error.start]:02x} at offset {error.start})") from None
    except (csv.Error, OSError) as error:
        raise TraceError(f"expected {_KINDS}, found {_shown(path)} unreadable ({printable(str(error))})") from None
    if not lines:
        raise TraceError(f"expected a column {OFFSET} in {_shown(path)}, found an empty file")
    header = [name.strip() for name in lines[0]]
    for number, line in enumerate(lines[1:], start=1):
        if not any(cell.strip() for cell in line):
            raise TraceError(f"expected an arrival in every row of {_shown(path)}, found row {number} blank")
    return header, [[*line, *[None] * (len(header) - len(line))] for line in lines[1:]]


def _parquet(path: Path) -> tuple[list[str], list[list[object]]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise TraceError(f"expected {_KINDS}, found {_shown(path)} unreadable "
                         f"({printable(str(error).splitlines()[0])})") from None
    for name, wanted in ((OFFSET, "numbers"), (STREAM, "integers")):
        if name in table.column_names and not _typed(table.schema.field(name).type, wanted):
            cells = table.column(name).to_pylist()
            row = next((row for row, cell in enumerate(cells) if cell is not None), 0)
            first = printable(repr(cells[row] if cells else None))
            raise TraceError(f"expected {wanted} in the column {name} of {_shown(path)}, found a column of "
                             f"{table.schema.field(name).type} (row {row + 1}: {first})")
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return list(table.column_names), [list(row) for row in zip(*columns)]


def _typed(kind: pa.DataType, wanted: str) -> bool:
    return pa.types.is_integer(kind) or (wanted == "numbers" and pa.types.is_floating(kind))


def _offsets(path: Path, cells: Sequence[object]) -> tuple[float, ...]:
    offsets: list[float] = []
    for row, cell in enumerate(cells, start=1):
        value = _number(cell)
        if value is None or not 0 <= value <= MAX_WAIT_S:
            raise TraceError(f"expected an offset in seconds from 0 to {MAX_WAIT_S:g} (one day) in every row of "
                             f"{_shown(path)}, found {shown_cell(cell)} in row {row}")
        if offsets and value < offsets[-1]:
            raise TraceError(f"expected offsets sorted from the earliest in {_shown(path)}, found {value:g} after "
                             f"{offsets[-1]:g} in row {row}")
        offsets.append(value)
    return tuple(offsets)


def _streams(path: Path, cells: Sequence[object]) -> tuple[int, ...]:
    streams = []
    for row, cell in enumerate(cells, start=1):
        value = cell if isinstance(cell, int) and not isinstance(cell, bool) else (
            int(cell) if isinstance(cell, str) and re.fullmatch(r"\s*\+?\d{1,9}\s*", cell) else None)
        if value is None or not 0 <= value < MAX_STREAMS:
            raise TraceError(f"expected a stream number from 0 to {MAX_STREAMS - 1} in every row of {_shown(path)}'s "
                             f"column {STREAM}, found {shown_cell(cell)} in row {row}")
        streams.append(value)
    return tuple(streams)


def _number(cell: object) -> float | None:
    """A finite number from a cell (a number, or text that reads as one); None for anything else."""
    if isinstance(cell, bool):
        return None
    value = float(cell) if isinstance(cell, (int, float)) else _float(cell) if isinstance(cell, str) else None
    return value if value is not None and math.isfinite(value) else None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _shown(path: Path) -> str:
    return printable(str(path))


@dataclass(frozen=True)
class Span:
    """One span of a rate schedule: Poisson arrivals at a rate going linearly from `start` to `end` requests/s."""

    start: float
    end: float
    seconds: float

    def arrivals(self, begin: float, rng: random.Random) -> Iterator[float]:
        """The span's arrival times from `begin` on, by thinning a Poisson process at the span's highest rate."""
        peak = max(self.start, self.end)
        due = 0.0
        while peak > 0:
            due += rng.expovariate(peak)
            if due >= self.seconds:
                return
            rate = self.start + (self.end - self.start) * due / self.seconds
            if rng.random() * peak < rate:
                yield begin + due


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|infinity|nan)"
_SPAN = re.compile(rf"\s*(?P<start>{_NUMBER})(?:\s*-\s*(?P<end>{_NUMBER}))?\s*@\s*(?P<seconds>{_NUMBER})\s*s?\s*",
                   re.IGNORECASE)


def parse_schedule(text: str) -> tuple[Span, ...]:
    """The spans of a schedule such as `100@10s,300@5s,100-400@10s`; ValueError in the refusal's words."""
    spans = tuple(_span(part) for part in text.split(","))
    cycle_s = sum(span.seconds for span in spans)
    offered = sum((span.start + span.end) / 2 * span.seconds for span in spans)
    if offered * MAX_WAIT_S < cycle_s:
        every = f"one request every {cycle_s / offered:.3g} s" if offered else "no request at all"
        raise ValueError(f"expected a schedule that offers at least one request a day on average, found "
                         f"{printable(repr(text))}, which offers {every}")
    return spans


def _span(part: str) -> Span:
    quoted = printable(repr(part.strip()))
    match = _SPAN.fullmatch(part)
    if match is None:
        raise ValueError(f"expected spans RATE@SECONDS or RATE-RATE@SECONDS separated by commas, such as "
                         f"\"100@10s,300@5s\", found {quoted}")
    start, seconds = float(match.group("start")), float(match.group("seconds"))
    end = float(match.group("end")) if match.group("end") else start
    for rate in (start, end):
        if not 0 <= rate <= MAX_RATE:  # NaN fails too
            raise ValueError(f"expected rates from 0 to {MAX_RATE:g} requests/s, found {shown_cell(rate)} in {quoted}")
    if not 0 < seconds <= MAX_WAIT_S:
        raise ValueError(f"expected each span to last more than 0 s and at most {MAX_WAIT_S:g} s (one day), "
                         f"found {quoted}")
    return Span(start, end, seconds)
