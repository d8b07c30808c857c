"""Byte access to a dataset root through fsspec, with retries for flaky remotes.

Every read of the episodes package goes through `Storage`, so local disk, HTTP,
S3 and the Hugging Face hub behave alike: exact byte ranges, transient errors
(HTTP 5xx, timeouts, dropped connections) retried with exponential backoff, and
every failure reported as one `FetchError` that names the URL.
"""
from __future__ import annotations

import bisect
import functools
import io
import posixpath
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
import pyarrow.parquet as pq

from episodes.errors import DatasetFormatError, FetchError

try:  # aiohttp backs fsspec's HTTP filesystem; without it HTTP roots cannot work anyway.
    import aiohttp
except ImportError:  # pragma: no cover - aiohttp is a pinned requirement
    aiohttp = None

T = TypeVar("T")


@dataclass(frozen=True)
class FileInfo:
    """What a sidecar needs to tell whether a remote file changed under it."""

    size: int
    version: str | None


def relative_path(rel: str) -> str:
    """Normalise a path relative to the root; refuse one that leaves the root.

    Templates in info.json come from the dataset, so a hostile or broken one
    must not be able to reach files outside the dataset.
    """
    if not rel or "://" in rel or rel.startswith("/") or "\\" in rel:
        raise DatasetFormatError(f"path {rel!r} is not a relative path inside the dataset root")
    norm = posixpath.normpath(rel)
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise DatasetFormatError(f"path {rel!r} resolves outside the dataset root")
    return norm


def coalesce_ranges(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) sorted and merged wherever at most `gap` bytes separate them.

    Overlapping and touching ranges always merge; the result is what one
    request per element would fetch.
    """
    if gap < 0:
        raise ValueError(f"the coalescing gap must be >= 0 bytes, not {gap}")
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if not 0 <= start <= end:
            raise ValueError(f"bad byte range [{start}, {end})")
        if merged and start - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _is_transient(exc: BaseException) -> bool:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status >= 500 or status == 429
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'message', '')}".rstrip()
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Storage:
    """One dataset root on any fsspec filesystem.

    Picklable: only the root and options travel to a spawned process, which
    opens its own filesystem (fsspec HTTP sessions cannot cross processes).
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: dict[str, Any] | None = None,
        retries: int = 3,
        backoff_s: float = 0.2,
        timeout_s: float = 30.0,
    ) -> None:
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError("retries and backoff_s must be >= 0 and timeout_s > 0")
        self.root = str(root).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._open_fs()

    def _open_fs(self) -> None:
        options = dict(self.storage_options)
        protocol = fsspec.utils.get_protocol(self.root)
        if protocol in ("http", "https") and aiohttp is not None:
            client_kwargs = dict(options.get("client_kwargs", {}))
            client_kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=self.timeout_s))
            options["client_kwargs"] = client_kwargs
        self.fs, self._base = fsspec.core.url_to_fs(self.root, **options)
        self._base = self._base.rstrip("/")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["fs"], state["_base"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_fs()

    def __repr__(self) -> str:
        return f"Storage({self.root!r})"

    def path(self, rel: str) -> str:
        """The filesystem path of `rel` (checked to stay inside the root)."""
        return f"{self._base}/{relative_path(rel)}"

    def url(self, rel: str) -> str:
        """The user-facing address of `rel`, for error messages."""
        return f"{self.root}/{relative_path(rel)}"

    def _call(self, rel: str, what: str, fn: Callable[[str], T]) -> T:
        path, url = self.path(rel), self.url(rel)
        for attempt in range(self.retries + 1):
            try:
                return fn(path)
            except Exception as exc:
                # fsspec's HTTP info reports any failed HEAD+GET (a 503 too) as FileNotFoundError
                # raised from the server's answer: judge by that answer.
                cause = exc.__cause__ if isinstance(exc, FileNotFoundError) and exc.__cause__ else exc
                if not _is_transient(cause):
                    if isinstance(exc, FileNotFoundError):
                        raise FetchError(f"{url}: file not found") from exc
                    raise FetchError(f"{url}: {what} failed ({_describe(exc)})") from exc
                if attempt == self.retries:
                    raise FetchError(
                        f"{url}: {what} failed after {attempt + 1} attempts ({_describe(cause)})"
                    ) from exc
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")  # the loop always returns or raises

    def read_bytes(self, rel: str) -> bytes:
        """A whole (small) file, such as info.json or an episodes Parquet."""
        return self._call(rel, "read", self.fs.cat_file)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Exactly bytes [start, end) of `rel`; fewer bytes is a FetchError."""
        if not 0 <= start <= end:
            raise ValueError(f"bad byte range [{start}, {end}) for {self.url(rel)}")
        if start == end:
            return b""
        data = self._call(
            rel, f"read of bytes [{start}, {end})", lambda p: self.fs.cat_file(p, start=start, end=end)
        )
        if len(data) != end - start:
            raise FetchError(
                f"{self.url(rel)}: read of bytes [{start}, {end}) returned {len(data)} bytes,"
                f" expected {end - start}"
            )
        return data

    def read_ranges(
        self, rel: str, ranges: Sequence[tuple[int, int]], *, coalesce_gap: int = 64 * 1024,
        executor: Executor | None = None,
    ) -> list[bytes]:
        """Several ranges of one file, merging those closer than `coalesce_gap` into one request.

        Round trips dominate remote reads; fetching a small gap costs less than
        another request. With an `executor` the merged requests run concurrently.
        """
        merged = coalesce_ranges(ranges, coalesce_gap)
        read = functools.partial(self.read_range, rel)
        if executor is None:
            blobs = [read(start, end) for start, end in merged]
        else:
            blobs = list(executor.map(lambda r: read(*r), merged))
        starts = [start for start, _ in merged]
        out = []
        for start, end in ranges:
            k = bisect.bisect_right(starts, start) - 1
            out.append(blobs[k][start - starts[k] : end - starts[k]])
        return out

    def info(self, rel: str) -> FileInfo:
        """Size and a change marker (ETag, else mtime or Last-Modified) of `rel`."""
        raw = self._call(rel, "info", self.fs.info)
        size = raw.get("size")
        if size is None:
            raise FetchError(f"{self.url(rel)}: the server did not report the file size")
        version = None
        for key in ("ETag", "etag", "mtime", "LastModified", "last_modified", "Last-Modified"):
            if raw.get(key) is not None:
                version = str(raw[key])
                break
        return FileInfo(size=int(size), version=version)

    def exists(self, rel: str) -> bool:
        """Whether `rel` exists; errors other than "not found" still raise FetchError."""
        try:
            self.info(rel)
        except FetchError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return False
            raise
        return True

    def glob(self, pattern: str) -> list[str]:
        """Paths relative to the root matching `pattern`, sorted.

        Empty when nothing matches or when the server refuses directory
        listings (HTTP 403/404/405), which most static HTTP servers do.
        """
        try:
            full = self._call(pattern, "listing", self.fs.glob)
        except FetchError as exc:
            cause = exc.__cause__
            if isinstance(cause, FileNotFoundError) or getattr(cause, "status", None) in (403, 404, 405):
                return []
            raise
        prefix = self._base + "/"
        return sorted(p[len(prefix) :] if p.startswith(prefix) else p for p in full)

    def open_parquet(self, rel: str) -> pq.ParquetFile:
        """A ParquetFile over `rel` whose every read is a retried range read.

        pyarrow then fetches only the footer and the row groups and columns
        asked for, and a flaky server mid-read gives a FetchError, not a raw
        client exception.
        """
        return pq.ParquetFile(_RangeFile(self, rel, self.info(rel).size))


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file whose reads are `Storage.read_range` calls."""

    def __init__(self, storage: Storage, rel: str, size: int) -> None:
        super().__init__()
        self._storage, self._rel, self._size, self._pos = storage, rel, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        end = min(self._pos + len(buffer), self._size)
        if end <= self._pos:
            return 0
        data = self._storage.read_range(self._rel, self._pos, end)
        buffer[: len(data)] = data
        self._pos = end
        return len(data)
