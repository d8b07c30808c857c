"""A remote file as a seekable file object whose every read is a retried range read of `Storage`.

pyarrow reads a Parquet file through one: it fetches only the footer and
the row groups and columns asked for.
"""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from episodes._storage import Storage


class RangeFile(io.RawIOBase):
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

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer)
        end = min(self._pos + len(view), self._size)
        if end <= self._pos:
            return 0
        data = self._storage.read_range(self._rel, self._pos, end)
        view[: len(data)] = data
        self._pos = end
        return len(data)
