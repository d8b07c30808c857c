"""Byte access to a dataset root through fsspec, with retries for flaky remotes.

Every read of the episodes package goes through `Storage`, so local disk, HTTP,
S3 and the Hugging Face hub behave alike: exact byte ranges, transient errors
(HTTP 5xx, timeouts, dropped connections) retried with exponential backoff, and
every failure reported as one `FetchError` that names the URL.

Over HTTP each attempt has `timeout_s` for the whole answer, headers and body
(aiohttp's total timeout), so a server that accepts and never answers, or
trickles a byte a second, costs at most `timeout_s` per attempt: a read fails
within timeout_s x (retries + 1) plus the backoff between attempts
(backoff_s x (1 + 2 + ... + 2^(retries-1)): 1.4 s with the defaults). The
range GET itself is episodes._http's.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import os
import posixpath
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, TypeVar

import fsspec
import pyarrow.parquet as pq

from episodes._errors import DatasetFormatError, FetchError
from episodes._http import HAVE_AIOHTTP, client_timeout, describe, http_range, is_transient, run_on_loop
from episodes._range_file import RangeFile

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

T = TypeVar("T")
# fsspec's options for a root's filesystem (credentials, client_kwargs, ...): whatever its protocol's filesystem
# takes, which fsspec, shipping no type information, does not say.
StorageOptions: TypeAlias = dict[str, Any]


class StorageSettings(TypedDict, total=False):
    """How a dataset's files are reached, as every opener of a dataset takes them (see Storage)."""

    storage_options: StorageOptions | None
    retries: int
    backoff_s: float
    timeout_s: float

# The protocols whose paths are files on this machine, where a symlink could lead out of the dataset.
_LOCAL = ("file", "local")


def open_filesystem(url: str, **options: object) -> tuple[AbstractFileSystem, str]:
    """fsspec's filesystem and path for `url`; a protocol whose package is missing is one FetchError saying which."""
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        protocol = fsspec.utils.get_protocol(url)
        raise FetchError(f"{url}: the {protocol}:// filesystem needs a package that is not installed ({exc}); "
                         "install it into the environment, or use a local path or an http(s):// URL") from None


@dataclass(frozen=True)
class FileInfo:
    """What a sidecar needs to tell whether a remote file changed under it."""

    size: int
    version: str | None


@dataclass(frozen=True)
class RangeAnswer:
    """A range read's bytes, and the file as the answer described it, where it did.

    An HTTP answer states the file's size (Content-Range's total) and its
    version (the ETag, else Last-Modified, as `Storage.info` picks them), so
    a read can tell that the file is still the one an index was made from
    without a request of its own; `file` is None where the answer does not
    say (other filesystems, a total of "*").
    """

    data: bytes
    file: FileInfo | None = None


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


def _check_range(url: str, start: int, end: int) -> None:
    if not 0 <= start <= end:
        raise ValueError(f"bad byte range [{start}, {end}) for {url}")


def _check_length(url: str, start: int, end: int, data: bytes) -> None:
    if len(data) != end - start:
        raise FetchError(f"{url}: read of bytes [{start}, {end}) returned {len(data)} bytes, expected {end - start}")


class Storage:
    """One dataset root on any fsspec filesystem.

    Picklable: only the root and options travel to a spawned process, which
    opens its own filesystem (fsspec HTTP sessions cannot cross processes).
    With `confine` (the default) a local file that resolves, through
    symlinks, outside the root is refused: a dataset's metadata names its
    files, and must not be able to make us read /etc/passwd.
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: StorageOptions | None = None,
        retries: int = 3,
        backoff_s: float = 0.2,
        timeout_s: float = 30.0,
        confine: bool = True,
    ) -> None:
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError("retries and backoff_s must be >= 0 and timeout_s > 0")
        self.root = str(root).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.confine = confine
        self._open_fs()

    def _open_fs(self) -> None:
        options = dict(self.storage_options)
        protocol = fsspec.utils.get_protocol(self.root)
        if protocol in ("http", "https") and HAVE_AIOHTTP:
            client_kwargs = dict(options.get("client_kwargs", {}))
            client_kwargs.setdefault("timeout", client_timeout(self.timeout_s))
            options["client_kwargs"] = client_kwargs
        self.fs, self._base = open_filesystem(self.root, **options)
        self._base = self._base.rstrip("/")
        self._http = protocol in ("http", "https")
        self._confined = _confinement(self._base) if self.confine and protocol in _LOCAL else ()
        self._checked: set[str] = set()

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        for derived in ("fs", "_base", "_http", "_confined", "_checked"):
            del state[derived]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._open_fs()

    def __repr__(self) -> str:
        return f"Storage({self.root!r})"

    def path(self, rel: str) -> str:
        """The filesystem path of `rel`, checked to stay inside the root, through symlinks too on local disk."""
        path = f"{self._base}/{relative_path(rel)}"
        if self._confined and path not in self._checked:
            real = os.path.realpath(path)
            if not any(real == base or real.startswith(base + os.sep) for base in self._confined):
                raise DatasetFormatError(f"{self.url(rel)}: is a symbolic link to a file outside the dataset root "
                                         f"({self.root}); refusing to read it")
            self._checked.add(path)
        return path

    @property
    def ranges_say_file(self) -> bool:
        """Whether a range read's answer states the file's size and version (RangeAnswer.file): over HTTP."""
        return self._http

    def url(self, rel: str) -> str:
        """The user-facing address of `rel`, for error messages."""
        return f"{self.root}/{relative_path(rel)}"

    def _call(self, rel: str, what: str, fn: Callable[[str], T]) -> T:
        path, url = self.path(rel), self.url(rel)
        for attempt in range(self.retries + 1):
            try:
                return fn(path)
            except Exception as exc:
                failure = self._failure(exc, url, what, attempt)
                if failure is not None:
                    raise failure from exc
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")  # the loop always returns or raises

    def _failure(self, exc: Exception, url: str, what: str, attempt: int) -> FetchError | None:
        """The FetchError that ends a call whose attempt `attempt` raised `exc`; None where another attempt is due."""
        # fsspec's HTTP info reports any failed HEAD+GET (a 503 too) as FileNotFoundError
        # raised from the server's answer: judge by that answer.
        cause = exc.__cause__ if isinstance(exc, FileNotFoundError) and exc.__cause__ else exc
        if not is_transient(cause):
            if isinstance(exc, FileNotFoundError):
                return FetchError(f"{url}: file not found")
            return FetchError(f"{url}: {what} failed ({describe(exc, self.timeout_s)})")
        if attempt == self.retries:
            return FetchError(f"{url}: {what} failed after {attempt + 1} attempts ({describe(cause, self.timeout_s)})")
        return None

    def read_bytes(self, rel: str) -> bytes:
        """A whole (small) file, such as info.json or an episodes Parquet."""
        return self._call(rel, "read", self.fs.cat_file)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Exactly bytes [start, end) of `rel`; fewer bytes is a FetchError."""
        if self._http:
            return self.start_ranges([(rel, start, end)])[0].result().data
        _check_range(self.url(rel), start, end)
        if start == end:
            return b""
        data = self._call(rel, f"read of bytes [{start}, {end})", lambda p: self.fs.cat_file(p, start=start, end=end))
        _check_length(self.url(rel), start, end, data)
        return data

    def start_ranges(self, ranges: Sequence[tuple[str, int, int]], executor: Executor | None = None,
                     slots: asyncio.Semaphore | None = None) -> list[Future[RangeAnswer]]:
        """Bytes [start, end) of each (file, start, end) on their way: read_range's bytes, and the file as the answer
        describes it.

        Over HTTP the reads run on the HTTP client's own event loop, handed
        to it at once, and no thread waits for each: a read's cost is the
        client's work alone. Their requests take one of `slots` while on the
        wire, in the order given: a link shared by every read at once would
        land the first one last. Elsewhere read_range runs on `executor`
        (None: on this thread, before this returns), whose threads bound how
        many run at once.
        """
        if self._http:
            return run_on_loop(self.fs.loop, [self._http_answer(rel, start, end, slots) for rel, start, end in ranges])
        return [self._start_range(rel, start, end, executor) for rel, start, end in ranges]

    def _start_range(self, rel: str, start: int, end: int, executor: Executor | None) -> Future[RangeAnswer]:
        if executor is not None:
            return executor.submit(lambda: RangeAnswer(self.read_range(rel, start, end)))
        done: Future[RangeAnswer] = Future()
        try:
            done.set_result(RangeAnswer(self.read_range(rel, start, end)))
        except Exception as exc:
            done.set_exception(exc)
        return done

    async def _http_answer(self, rel: str, start: int, end: int, slots: asyncio.Semaphore | None) -> RangeAnswer:
        """read_range over HTTP, on the client's loop: retried as `_call` retries, the backoff slept on the loop."""
        path, url = self.path(rel), self.url(rel)
        _check_range(url, start, end)
        if start == end:
            return RangeAnswer(b"")
        what = f"read of bytes [{start}, {end})"
        for attempt in range(self.retries + 1):
            try:
                async with slots or contextlib.nullcontext():
                    got = await http_range(self.fs, path, start, end)
            except Exception as exc:
                failure = self._failure(exc, url, what, attempt)
                if failure is not None:
                    raise failure from exc
                await asyncio.sleep(self.backoff_s * 2**attempt)
                continue
            _check_length(url, start, end, got.data)
            return RangeAnswer(got.data, None if got.total is None else FileInfo(got.total, got.version))
        raise AssertionError("unreachable")  # the loop always returns or raises

    def probe_ranges(self, rel: str) -> None:
        """One small range read of `rel`, so a server that ignores Range requests is found before a job starts."""
        if self._http:
            self.read_range(rel, 0, 1)

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
        return pq.ParquetFile(RangeFile(self, rel, self.info(rel).size))


def _confinement(base: str) -> tuple[str, ...]:
    """Real directories a local root's files may resolve into: the root, and a Hugging Face cache's blobs.

    huggingface_hub's cache keeps a snapshot's files as symlinks from
    `snapshots/<revision>/...` to `../../blobs/<hash>`: a dataset opened
    there leads out of its root by design, but only into its repository.
    """
    real = Path(os.path.realpath(base or "/"))
    for folder in (real, *real.parents):
        if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
            return str(real), str(folder.parent.parent / "blobs")
    return (str(real),)
