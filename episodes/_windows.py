"""Frame windows fetched: the coalesced range reads of a batch of requests, and mini-MP4s cut from what arrived.

The cache plans a WindowJob per request (episodes._mp4.windows says which
samples its frames need); submit_ranges merges the runs of all jobs that lie
in one file, whatever their episode, into range requests no closer than the
coalescing gap and starts them on an executor, in the order the jobs first
need them, so the first request's bytes come first; it tells each job which
read each of its runs lies in. window_mini cuts runs out of the blobs read
into a mini-MP4 of just those samples: all of a job's runs once every read
is in, or those whose reads are in so far, so that decoding can start while
the rest is on the wire (each run starts where decoding can, so runs decode
alike alone or together).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from episodes._errors import EpisodeDataError, Mp4FormatError, reworded
from episodes._indexes import FileClaim
from episodes._mp4 import MiniMp4, Mp4Index
from episodes._mp4.windows import FrameWindows
from episodes._mp4.writer import build_mini_mp4, gather_samples
from episodes._reads import FetchedFrames
from episodes._storage import RangeAnswer, coalesce_ranges

# How a batch starts its range reads, each (file, first byte, end byte), in order (Storage.start_ranges).
StartRanges = Callable[[Sequence[tuple[str, int, int]]], "list[Future[RangeAnswer]]"]


@dataclass(frozen=True, eq=False)
class WindowJob:
    """One request of a windows read, planned: where its frames lie and which samples they need.

    `numbers` are its episode frame numbers in the order asked; `where`
    starts every error message about it; `claim` is its index's, where the
    index came from the sidecar unchecked (episodes._indexes).
    """

    ep: int
    key: str
    rel: str
    url: str
    numbers: np.ndarray
    length: int
    index: Mp4Index
    windows: FrameWindows
    lookup_s: float
    claim: FileClaim | None = None

    @property
    def where(self) -> str:
        return f"{self.url}: episode {self.ep}, camera {self.key}"


@dataclass(frozen=True, eq=False)
class JobReads:
    """A job's share of a batch's range reads: for each of its runs, the start of the read it lies in.

    `reads` holds the reads it needs by start byte; `charged` is what it
    pays, the reads no job before it in the batch needed, and `frees` what
    is no longer needed once it is done, the reads no job after it needs.
    """

    job: WindowJob
    run_reads: tuple[int, ...]
    reads: dict[int, Future[RangeAnswer]]
    charged: int
    frees: int = 0

    def blob(self, start: int) -> bytes:
        """The bytes of the read starting at `start`, waited for; a failed read is the job's error, and so is a
        file that is not the one its index was made from (StaleIndex, settled by the first answer taken)."""
        try:
            answer = self.reads[start].result()
            if self.job.claim is not None:
                self.job.claim.settle(answer.file)
        except EpisodeDataError as exc:
            raise reworded(exc, self.job.url, f"episode {self.job.ep}, camera {self.job.key}") from exc
        return answer.data


@dataclass(frozen=True)
class RangeBatch:
    """A batch's range reads, started: each job's share, the reads made, the distinct useful sample bytes."""

    jobs: tuple[JobReads, ...]
    range_requests: int
    useful_bytes: int


def submit_ranges(start_ranges: StartRanges, jobs: Sequence[WindowJob], gap: int) -> RangeBatch:
    """Start reading the runs of all jobs, coalesced per file with `gap`, in the order the jobs need them."""
    by_file: dict[str, list[WindowJob]] = {}
    for job in jobs:
        by_file.setdefault(job.rel, []).append(job)
    merged = {rel: coalesce_ranges([(r.byte_start, r.byte_end) for j in js for r in j.windows.runs], gap)
              for rel, js in by_file.items()}
    order: dict[tuple[str, int], int] = {}   # each read's end byte, in the order the jobs first need it
    last: dict[tuple[str, int], int] = {}
    needs, charges = [], []
    for i, job in enumerate(jobs):
        ranges = merged[job.rel]
        starts = [start for start, _ in ranges]
        at = [int(np.searchsorted(starts, r.byte_start, side="right")) - 1 for r in job.windows.runs]
        charged = 0
        for k in dict.fromkeys(at):
            start, end = ranges[k]
            if (job.rel, start) not in order:
                order[(job.rel, start)] = end
                charged += end - start
            last[(job.rel, start)] = i
        needs.append(tuple(starts[k] for k in at))
        charges.append(charged)
    futures = dict(zip(order, start_ranges([(rel, start, end) for (rel, start), end in order.items()])))
    shares = [JobReads(job, run_reads, {start: futures[(job.rel, start)] for start in run_reads}, charged)
              for job, run_reads, charged in zip(jobs, needs, charges)]
    sizes = {(rel, start): end - start for rel, ranges in merged.items() for start, end in ranges}
    frees = [0] * len(shares)
    for read, i in last.items():
        frees[i] += sizes[read]
    return RangeBatch(tuple(dataclasses.replace(share, frees=free) for share, free in zip(shares, frees)),
                      len(order), sum(_distinct_bytes(js) for js in by_file.values()))


def range_bytes(jobs: Sequence[WindowJob], gap: int) -> int:
    """What submit_ranges would read for `jobs`: the bytes of their runs coalesced per file with `gap`."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for job in jobs:
        by_file.setdefault(job.rel, []).extend((r.byte_start, r.byte_end) for r in job.windows.runs)
    return sum(end - start for ranges in by_file.values() for start, end in coalesce_ranges(ranges, gap))


def _distinct_bytes(jobs: Sequence[WindowJob]) -> int:
    """Bytes of the distinct samples the runs of `jobs` (all of one file) hold."""
    samples = np.unique(np.concatenate([job.windows.samples for job in jobs]))
    return int(jobs[0].index.size[samples].sum())


def window_mini(share: JobReads, blobs: Mapping[int, bytes], paid: int, fetch_s: float,
                runs: Sequence[int] | None = None) -> FetchedFrames:
    """A mini-MP4 of the job's `runs` (indices into its runs, all by default) cut out of `blobs` (by read start).

    With every run, its frames are the request's, in the order asked;
    with some, the distinct frames those runs show, ascending. `paid` and
    `fetch_s` are the bytes and seconds the result reports.
    """
    job = share.job
    started = time.perf_counter()
    picked = range(len(job.windows.runs)) if runs is None else runs
    windows = job.windows
    try:
        parts, samples = [], []
        for k in picked:
            run, start = windows.runs[k], share.run_reads[k]
            span = np.arange(run.start, run.stop)
            parts.append(gather_samples(job.index, span, blobs[start], start))
            samples.append(span)
        shown = np.concatenate(samples)
        mine = np.isin(windows.frame_samples, shown)
        mini: MiniMp4 = build_mini_mp4(job.index, shown, b"".join(parts), windows.frame_samples[mine],
                                       windows.frame_numbers[mine], job.length)
    except Mp4FormatError as exc:
        raise reworded(exc, job.url, f"episode {job.ep}, camera {job.key}") from exc
    numbers = job.numbers if runs is None else windows.frame_numbers[mine]
    return FetchedFrames(job.ep, job.key, numbers, mini, False, paid, 0, job.lookup_s, fetch_s,
                         time.perf_counter() - started)


def when_landed(reads: Sequence[Future[Any]], then: Callable[[], None]) -> None:
    """Call `then` once every read of `reads` has finished, on the thread that finished the last.

    The reads keep no hold on `then` once it has been called: it refers
    to what refers to the reads, and a cycle would keep their bytes in
    memory until the garbage collector's next full pass.
    """
    left, pending = [len(reads)], [then]
    lock = threading.Lock()

    def one(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            fire = pending.pop() if left[0] <= 0 and pending else None
        if fire is not None:
            fire()

    if not reads:
        one(Future())
    for read in reads:
        read.add_done_callback(one)
