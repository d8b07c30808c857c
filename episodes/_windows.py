"""Frame windows fetched: the coalesced range reads of a batch of requests, and each request's mini-MP4.

The cache plans a WindowJob per request (episodes._mp4.windows says which
samples its frames need); fetch_ranges merges the runs of all jobs that lie
in one file, whatever their episode, into range requests no closer than
the coalescing gap, reads them concurrently, and hands each job the blobs
its runs lie in; window_mini cuts the runs out of those blobs into a
mini-MP4 of just those samples.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from episodes._errors import EpisodeDataError, Mp4FormatError, reworded
from episodes._mp4 import MiniMp4, Mp4Index
from episodes._mp4.windows import FrameWindows
from episodes._mp4.writer import build_mini_mp4, gather_samples
from episodes._reads import FetchedFrames
from episodes._storage import Storage, coalesce_ranges


@dataclass(frozen=True, eq=False)
class WindowJob:
    """One request of a windows read, planned: where its frames lie and which samples they need.

    `numbers` are its episode frame numbers in the order asked; `where`
    starts every error message about it.
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

    @property
    def where(self) -> str:
        return f"{self.url}: episode {self.ep}, camera {self.key}"


@dataclass(frozen=True)
class RangeBatch:
    """The fetched ranges of a batch, per job (keyed by id): its blobs (start, bytes), bytes charged, seconds waited.

    A range several jobs share is charged to the first of them, so the
    charges add up to the bytes read. `useful_bytes` counts the distinct
    samples all jobs need, file by file.
    """

    blobs: dict[int, list[tuple[int, bytes]]]
    charged: dict[int, int]
    waited: dict[int, float]
    range_requests: int
    useful_bytes: int


def fetch_ranges(storage: Storage, executor: Executor, jobs: Sequence[WindowJob], gap: int) -> RangeBatch:
    """Read the runs of all jobs, coalesced per file with `gap`, concurrently on `executor`."""
    by_file: dict[str, list[WindowJob]] = {}
    for job in jobs:
        by_file.setdefault(job.rel, []).append(job)
    merged = {rel: coalesce_ranges([(r.byte_start, r.byte_end) for j in js for r in j.windows.runs], gap)
              for rel, js in by_file.items()}
    futures = {(rel, start): executor.submit(storage.read_range, rel, start, end)
               for rel, ranges in merged.items() for start, end in ranges}
    batch = RangeBatch({}, {}, {}, len(futures), sum(_distinct_bytes(js) for js in by_file.values()))
    charged: set[tuple[str, int]] = set()
    for job in jobs:
        starts = [start for start, _ in merged[job.rel]]
        needed = sorted({starts[int(np.searchsorted(starts, r.byte_start, side="right")) - 1] for r in job.windows.runs})
        began, blobs, paid = time.perf_counter(), [], 0
        for start in needed:
            try:
                blobs.append((start, futures[(job.rel, start)].result()))
            except EpisodeDataError as exc:
                raise reworded(exc, job.url, f"episode {job.ep}, camera {job.key}") from exc
            if (job.rel, start) not in charged:
                charged.add((job.rel, start))
                paid += len(blobs[-1][1])
        batch.blobs[id(job)], batch.charged[id(job)] = blobs, paid
        batch.waited[id(job)] = time.perf_counter() - began
    return batch


def _distinct_bytes(jobs: Sequence[WindowJob]) -> int:
    """Bytes of the distinct samples the runs of `jobs` (all of one file) hold."""
    samples = np.unique(np.concatenate([job.windows.samples for job in jobs]))
    return int(jobs[0].index.size[samples].sum())


def window_mini(job: WindowJob, blobs: list[tuple[int, bytes]], paid: int, fetch_s: float) -> FetchedFrames:
    """The job's mini-MP4 cut out of its fetched blobs, and what it cost (`paid` bytes, `fetch_s` waited)."""
    started = time.perf_counter()
    blob_starts = [start for start, _ in blobs]
    parts = []
    try:
        for run in job.windows.runs:
            start, blob = blobs[int(np.searchsorted(blob_starts, run.byte_start, side="right")) - 1]
            parts.append(gather_samples(job.index, np.arange(run.start, run.stop), blob, start))
        mini: MiniMp4 = build_mini_mp4(job.index, job.windows.samples, b"".join(parts), job.windows.frame_samples,
                                       job.windows.frame_numbers, job.length)
    except Mp4FormatError as exc:
        raise reworded(exc, job.url, f"episode {job.ep}, camera {job.key}") from exc
    return FetchedFrames(job.ep, job.key, job.numbers, mini, False, paid, 0, job.lookup_s, fetch_s,
                         time.perf_counter() - started)

