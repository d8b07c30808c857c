"""HTTP's part of storage: a range GET that insists on the range it asked for, and what its answer says of the file.

It runs on fsspec's HTTP client (aiohttp) and its event loop; episodes._storage
retries it, bounds how many run at once and words its failures as
`is_transient` and `describe` judge them.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

try:  # aiohttp backs fsspec's HTTP filesystem; without it HTTP roots cannot work anyway.
    import aiohttp
    HAVE_AIOHTTP = True
except ImportError:  # pragma: no cover - aiohttp is a pinned requirement
    HAVE_AIOHTTP = False

if TYPE_CHECKING:
    from fsspec.implementations.http import HTTPFileSystem

T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class ServerFault(Exception):
    """A server's answer that cannot be the bytes asked for; `str()` says what it sent instead."""


class RangeIgnored(ServerFault):
    """The server answered a Range request with the whole file (HTTP 200): it does not serve ranges."""


class RangeMismatch(ServerFault):
    """The server's Content-Range is not the range asked for: a misbehaving cache or server, maybe transient."""


@dataclass(frozen=True)
class HttpRange:
    """A range answer's bytes, the file's size as Content-Range states it (None for "*"), and its version: the
    ETag, else Last-Modified, as fsspec's info reports them (None where the answer has neither)."""

    data: bytes
    total: int | None
    version: str | None


def client_timeout(total_s: float) -> object:
    """The client's timeout for a whole answer, headers and body (see episodes._storage)."""
    return aiohttp.ClientTimeout(total=total_s)


def is_transient(exc: BaseException) -> bool:
    """Whether a read that failed with `exc` is worth another attempt: a server error or throttling (5xx, 429),
    a timeout, a dropped connection, a range answered wrong, or another of the HTTP client's own errors."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status >= 500 or status == 429
    if isinstance(exc, (TimeoutError, ConnectionError, RangeMismatch)):
        return True
    return HAVE_AIOHTTP and isinstance(exc, aiohttp.ClientError)


def describe(exc: BaseException, timeout_s: float | None = None) -> str:
    """A failed attempt's cause, as a FetchError's message words it."""
    if isinstance(exc, ServerFault):
        return str(exc)
    if isinstance(exc, TimeoutError) and timeout_s is not None:
        return f"no complete answer within the timeout of {timeout_s:g} s"
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'message', '')}".rstrip()
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def http_range(fs: HTTPFileSystem, path: str, start: int, end: int) -> HttpRange:
    """GET bytes [start, end) of `path`, insisting that the answer is exactly that range.

    fsspec's own range read returns whatever body comes back; a server that
    ignores Range (200 and the whole file) or answers another range would
    hand wrong bytes to the MP4 parser, which would then blame the file.
    """
    options = fs.kwargs.copy()
    headers = {**options.pop("headers", {}), "Range": f"bytes={start}-{end - 1}"}
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), headers=headers, **options) as response:
        if response.status == 404:
            raise FileNotFoundError(path)
        response.raise_for_status()
        if response.status == 200:
            raise RangeIgnored("the server ignores Range requests: it answered HTTP 200 with the whole file")
        answered = response.headers.get("Content-Range", "")
        match = _CONTENT_RANGE.fullmatch(answered.strip())
        if match is None or (int(match[1]), int(match[2])) != (start, end - 1):
            raise RangeMismatch(f"the server answered Content-Range {answered or '(none)'!r} to a request for "
                                f"bytes {start}-{end - 1}")
        data = await response.read()
        return HttpRange(data, None if match[3] == "*" else int(match[3]),
                         response.headers.get("ETag") or response.headers.get("Last-Modified"))


def run_on_loop(loop: asyncio.AbstractEventLoop, coros: Sequence[Coroutine[Any, Any, T]]) -> list[Future[T]]:
    """Each coroutine run as a task on `loop`, another thread's, all handed over at once.

    asyncio.run_coroutine_threadsafe wakes the loop for each coroutine, and
    each wake-up contends for the interpreter with the thread handing them
    over; a batch of reads is one wake-up here. Cancelling a future cancels
    its task.
    """
    futures: list[Future[T]] = [Future() for _ in coros]

    def start() -> None:
        for coro, future in zip(coros, futures):
            if future.cancelled():
                coro.close()
                continue
            task = loop.create_task(coro)
            task.add_done_callback(functools.partial(_settle, future))
            future.add_done_callback(functools.partial(_cancel, loop, task))
    loop.call_soon_threadsafe(start)
    return futures


def _settle(future: Future[T], task: asyncio.Task[T]) -> None:
    """The task's outcome into its future, unless someone cancelled that first."""
    with contextlib.suppress(InvalidStateError):
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(task.exception())
        else:
            future.set_result(task.result())


def _cancel(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], future: Future[Any]) -> None:
    if future.cancelled():
        loop.call_soon_threadsafe(task.cancel)
