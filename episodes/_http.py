"""HTTP's part of storage: a range GET that insists on the range it asked for, and what its answer says of the file.

It runs on fsspec's HTTP client (aiohttp) and its event loop; episodes._storage
retries it, words its failures and bounds how many run at once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

try:  # aiohttp backs fsspec's HTTP filesystem; without it HTTP roots cannot work anyway.
    import aiohttp
    HAVE_AIOHTTP = True
except ImportError:  # pragma: no cover - aiohttp is a pinned requirement
    HAVE_AIOHTTP = False

if TYPE_CHECKING:
    from fsspec.implementations.http import HTTPFileSystem

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


def is_client_error(exc: BaseException) -> bool:
    """Whether `exc` is the HTTP client's own (a dropped connection, a bad answer): worth another attempt."""
    return HAVE_AIOHTTP and isinstance(exc, aiohttp.ClientError)


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
