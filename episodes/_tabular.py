"""Data columns in a usage format: each column of a data file as a memmapped .npy, sliced per episode.

Parquet is the storage format: reading one episode's `observation.state`
means fetching and decoding the row groups that hold it, about half a
millisecond even from local disk. A loader reads the same columns for every
item, so the first read of a data file's columns copies each into a .npy
file under the cache directory the caller names, beside the MP4 sidecar
(see episodes._sidecar.local_cache_path), and
every later read slices a memmap of it. Each copy is stamped with the
source's size and change marker (mtime or ETag): a changed source is read
again, never served stale. Files are written whole and renamed into place,
so processes sharing a cache directory at worst repeat a copy.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from episodes._errors import DatasetFormatError
from episodes._layout import ROW_INDEX
from episodes._sidecar import local_cache_path
from episodes._storage import FileInfo, Storage

USAGE_DIR = "rnb_usage.v1"
_MANIFEST = "manifest.json"


def column_array(column: pa.ChunkedArray | pa.Array, name: str, where: str) -> np.ndarray:
    """A numeric column as numpy: (N,) for scalars, (N, D) for fixed-size lists such as state and action.

    Zero-copy when the column is one chunk (an episode inside one row
    group); several chunks cost one concatenation. Nulls are refused, since
    numpy has no place for them.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    kind = column.type
    nested = pa.types.is_fixed_size_list(kind)
    value_type = kind.value_type if nested else kind
    if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_boolean(value_type)):
        raise DatasetFormatError(f"{where}: column {name!r} is {kind}, not numeric or a fixed-size list of numbers")
    if column.null_count or (nested and any(chunk.values.null_count for chunk in chunks)):
        raise DatasetFormatError(f"{where}: column {name!r} has null values")
    if nested:
        parts = [chunk.flatten().to_numpy(zero_copy_only=False).reshape(-1, kind.list_size) for chunk in chunks]
        empty = np.empty((0, kind.list_size), value_type.to_pandas_dtype())
    else:
        parts = [chunk.to_numpy(zero_copy_only=False) for chunk in chunks]
        empty = np.empty(0, value_type.to_pandas_dtype())
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else empty


class UsageCache:
    """The usage-format copies of one dataset root's data files (thread-safe).

    `columns(rel, names, read)` returns memmaps of whole-file columns plus
    the file's row-index column; `read(names)` is how to get the columns
    from Parquet when no valid copy exists.
    """

    def __init__(self, storage: Storage, cache_dir: str | os.PathLike[str]) -> None:
        self.storage = storage
        self.dir = local_cache_path(storage, USAGE_DIR, cache_dir)
        self._lock = threading.Lock()
        self._checked: dict[str, FileInfo] = {}
        self._arrays: dict[tuple[str, str], np.ndarray] = {}

    def columns(self, rel: str, names: Sequence[str], read: Callable[[list[str]], pa.Table]) -> dict[str, np.ndarray]:
        """{name: array over the whole file} for `names` and the row index, copying what is missing first."""
        wanted = list(dict.fromkeys([*names, ROW_INDEX]))
        with self._lock:
            found = {name: self._arrays[rel, name] for name in wanted if (rel, name) in self._arrays}
        if len(found) == len(wanted):
            return found
        return self._load(rel, wanted, read)

    def _load(self, rel: str, wanted: list[str], read: Callable[[list[str]], pa.Table]) -> dict[str, np.ndarray]:
        folder = self.dir / urllib.parse.quote(rel, safe="")
        info = self._info(rel)
        manifest = _read_manifest(folder)
        stored = _columns(manifest) if manifest.get("stamp") == [info.size, info.version] else set()
        missing = [name for name in wanted if name not in stored]
        if missing:
            table = read(missing)
            where = self.storage.url(rel)
            for name in missing:
                _write_array(folder / _file_name(name), column_array(table.column(name), name, where))
            stored |= set(missing)
            _write_manifest(folder, {"stamp": [info.size, info.version], "columns": sorted(stored)})
        # Plain ndarray views of the memmaps: slicing them skips np.memmap's per-slice bookkeeping.
        arrays = {name: np.load(folder / _file_name(name), mmap_mode="r").view(np.ndarray) for name in wanted}
        index = arrays[ROW_INDEX]
        if len(index) > 1 and not (index[1:] > index[:-1]).all():
            raise DatasetFormatError(f"{self.storage.url(rel)}: column {ROW_INDEX!r} does not strictly increase, "
                                     "which the usage-format cache relies on")
        with self._lock:
            self._arrays.update({(rel, name): array for name, array in arrays.items()})
        return arrays

    def _info(self, rel: str) -> FileInfo:
        """The source's stamp, asked once per file and process (a remote asks cost a round trip)."""
        with self._lock:
            info = self._checked.get(rel)
        if info is None:
            info = self.storage.info(rel)
            with self._lock:
                self._checked[rel] = info
        return info


def _file_name(column: str) -> str:
    return urllib.parse.quote(column, safe="") + ".npy"


def _read_manifest(folder: Path) -> dict[str, object]:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _columns(manifest: dict[str, object]) -> set[str]:
    """The column names a manifest lists (none from one that holds no list of them)."""
    columns = manifest.get("columns", ())
    return {name for name in columns if isinstance(name, str)} if isinstance(columns, list) else set()


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rnb_usage_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_array(path: Path, array: np.ndarray) -> None:
    _atomic_write(path, lambda out: np.save(out, np.ascontiguousarray(array), allow_pickle=False))


def _write_manifest(folder: Path, manifest: dict[str, object]) -> None:
    on_disk = _read_manifest(folder)
    if on_disk.get("stamp") == manifest["stamp"]:  # another process added columns meanwhile
        manifest = {**manifest, "columns": sorted(_columns(manifest) | _columns(on_disk))}
    _atomic_write(folder / _MANIFEST, lambda out: out.write(json.dumps(manifest).encode()))
