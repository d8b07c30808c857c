"""Frame-window fetches started: requests planned, their reads held against the budget, put on the wire, and made
ready to decode as they land.

A batch of requests is planned by the cache (its windows, or a kept
episode's mini-MP4), its range reads take a hold on the budget for every
byte they bring (a fetch ahead only where they fit) and start in the order
the requests need them (episodes._windows). Where the reader decodes on
the CPU, each request's mini-MP4 is cut and its decoder opened on a fetch
thread once its last read lands, so that its reader only decodes
(episodes._ready_parts: at most `max_ready` wait for their readers).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

from episodes._budget import Holds
from episodes._inflight import Started, WindowsInFlight, WindowsStart
from episodes._reads import FetchedFrames, FrameRequest
from episodes._ready_parts import ReadyParts
from episodes._windows import StartRanges, WindowJob, range_bytes, submit_ranges, when_landed

# What the cache makes of a request before any byte is read: its windows, or its frames in a kept whole episode.
Plan = Callable[[FrameRequest], WindowJob | FetchedFrames]


class WindowStarts:
    """How an EpisodeByteCache starts its frame-window fetches (see the module); `count` adds to its stats."""

    def __init__(self, start_ranges: StartRanges, pool: Executor, budget: Holds, plan: Plan,
                 count: Callable[..., None], *, decode_threads: int, max_ready: int) -> None:
        self._start_ranges, self._pool, self._budget = start_ranges, pool, budget
        self._plan, self._count = plan, count
        self._ready = ReadyParts(pool, count, room=max_ready, decode_threads=decode_threads)

    def start(self, requests: Sequence[FrameRequest], gap: int, *, ahead: bool, cpu: bool) -> list[WindowsInFlight]:
        """One handle per request; planned here, or (ahead) on the pool while the caller goes on."""
        if not ahead:
            return [self._handle(r, done, gap, ahead=False, cpu=cpu)
                    for r, done in zip(requests, self._started(requests, gap, ahead=False, cpu=cpu))]
        futures: list[Future[Started]] = [Future() for _ in requests]
        task = self._pool.submit(self._start_ahead, requests, gap, futures, cpu)
        task.add_done_callback(functools.partial(_never_started, futures))
        return [self._handle(r, future, gap, ahead=True, cpu=cpu) for r, future in zip(requests, futures)]

    def _started(self, requests: Sequence[FrameRequest], gap: int, *, ahead: bool, cpu: bool) -> list[Started]:
        """Each request planned and the batch's range reads started, holding their bytes from now on (ahead: only
        where they fit, else nothing is read and the windows' requests get None)."""
        plans = [self._plan(request) for request in requests]
        jobs = [plan for plan in plans if isinstance(plan, WindowJob)]
        if not jobs:
            return [plan for plan in plans if not isinstance(plan, WindowJob)]
        need = range_bytes(jobs, gap)
        hold = self._budget.hold_ahead(need) if ahead else self._budget.hold_now(need)
        if hold is None:
            return [None if isinstance(plan, WindowJob) else plan for plan in plans]
        batch = submit_ranges(self._start_ranges, jobs, gap)
        reads = list({id(read): read for share in batch.jobs for read in share.reads.values()}.values())

        def cancel_reads() -> None:
            for read in reads:
                read.cancel()
        hold.on_drop = cancel_reads
        when_landed(reads, functools.partial(self._budget.landed, hold))
        self._count(range_requests=batch.range_requests, bytes_useful=batch.useful_bytes)
        for share in batch.jobs:
            w = share.job.windows
            self._count(misses=1, windows=len(w.frame_numbers), window_runs=len(w.runs), bytes_planned=w.planned_bytes,
                        bytes_fetched=share.charged, lookup_s=share.job.lookup_s)
        starts = iter([WindowsStart(share, hold, self._ready.later(share) if cpu else None) for share in batch.jobs])
        return [next(starts) if isinstance(plan, WindowJob) else plan for plan in plans]

    def _start_ahead(self, requests: Sequence[FrameRequest], gap: int, futures: list[Future[Started]],
                     cpu: bool) -> None:
        """_started ahead of the reads, on a pool thread; each request's start (or the error) into its future."""
        try:
            for future, started in zip(futures, self._started(requests, gap, ahead=True, cpu=cpu)):
                future.set_result(started)
        except BaseException as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)

    def _handle(self, request: FrameRequest, started: Started | Future[Started], gap: int, *, ahead: bool,
                cpu: bool) -> WindowsInFlight:
        """The reader's handle on one request; started again on the spot where a fetch ahead fell through."""
        if not isinstance(started, Future):
            done: Future[Started] = Future()
            done.set_result(started)
            started = done

        def again() -> WindowsInFlight:
            return self._handle(request, self._started([request], gap, ahead=False, cpu=cpu)[0], gap, ahead=False,
                                cpu=cpu)
        return WindowsInFlight(int(request.episode), request.key, started, again, self._budget, ahead=ahead)


def _never_started(futures: list[Future[Started]], task: Future[None]) -> None:
    """A start the closing cache cancelled before it ran: its readers get that, not a wait without end."""
    if task.cancelled():
        for future in futures:
            future.set_exception(RuntimeError("the EpisodeByteCache is closed"))
