"""Persisted MP4 indexes, so a second run over a dataset reads no MP4 headers.

One versioned npz file holds the index of every video file seen so far,
each entry stamped with the file's size and change marker (mtime or ETag).
It lives in a per-root directory under the cache directory the caller
names, never inside the dataset, so a read-only dataset works and a user's
dataset holds only what they put there. A stale entry (size or marker
changed) is ignored and rebuilt; an unreadable sidecar is treated as empty,
because it is only ever a shortcut.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
import zipfile
from pathlib import Path

import fsspec
import numpy as np

from episodes._errors import Mp4FormatError
from episodes._mp4 import Mp4Index
from episodes._storage import FileInfo, Storage

SIDECAR_NAME = "rnb_mp4_index.v1.npz"
FORMAT_VERSION = 1


def local_cache_path(storage: Storage, name: str, cache_dir: str | os.PathLike[str]) -> Path:
    """Where a derived file `name` of `storage`'s root lives (the MP4 sidecar, the usage-format arrays).

    Under `cache_dir`, in a directory named after a hash of the root: its
    URL, or for a local root its real path, so that every spelling of one
    directory shares one cache.
    """
    root = storage.root
    if fsspec.utils.get_protocol(root) in ("file", "local"):
        root = os.path.realpath(fsspec.core.strip_protocol(root))
    digest = hashlib.sha256(root.encode()).hexdigest()[:16]
    return Path(cache_dir) / digest / name


def sidecar_path(storage: Storage, cache_dir: str | os.PathLike[str]) -> Path:
    """Where the MP4-index sidecar of `storage`'s root lives (see local_cache_path)."""
    return local_cache_path(storage, SIDECAR_NAME, cache_dir)


class IndexSidecar:
    """The sidecar of one dataset root: load once, look up per file, save on every new index.

    Several processes may share a sidecar: saves merge with what is on disk
    and replace the file atomically, so the worst a race costs is a rebuild.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries = self._load()

    def _load(self) -> dict[str, tuple[FileInfo, dict[str, np.ndarray]]]:
        try:
            with np.load(self.path, allow_pickle=False) as npz:
                manifest = json.loads(bytes(npz["manifest"]).decode())
                if manifest.get("format") != FORMAT_VERSION:
                    return {}
                entries = {}
                for n, item in enumerate(manifest["files"]):
                    prefix = f"{n}/"
                    arrays = {k[len(prefix):]: npz[k] for k in npz.files if k.startswith(prefix)}
                    entries[item["path"]] = (FileInfo(int(item["size"]), item["version"]), arrays)
                return entries
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError):
            return {}

    def lookup(self, rel: str, info: FileInfo, *, name: str) -> Mp4Index | None:
        """The stored index of `rel` if it was made from a file of exactly this size and version."""
        stored = self.stored(rel, name=name)
        return stored[1] if stored is not None and stored[0] == info else None

    def stored(self, rel: str, *, name: str) -> tuple[FileInfo, Mp4Index] | None:
        """The stored index of `rel` and the file it was made from, unchecked: for a reader that checks the file
        itself (episodes._indexes.FileClaim)."""
        with self._lock:
            entry = self._entries.get(rel)
        if entry is None:
            return None
        try:
            return entry[0], Mp4Index.from_arrays(entry[1], name=name)
        except (Mp4FormatError, ValueError, TypeError):
            return None

    def store(self, rel: str, info: FileInfo, index: Mp4Index) -> None:
        """Record `index` for `rel` and rewrite the sidecar; a failed write only costs a rebuild next run."""
        with self._lock:
            on_disk = self._load()
            on_disk.update(self._entries)
            on_disk[rel] = (info, index.to_arrays())
            self._entries = on_disk
            try:
                self._write(on_disk)
            except OSError:
                pass

    def _write(self, entries: dict[str, tuple[FileInfo, dict[str, np.ndarray]]]) -> None:
        files: list[dict[str, object]] = []
        arrays: dict[str, np.ndarray] = {}
        for n, (rel, (info, entry)) in enumerate(sorted(entries.items())):
            files.append({"path": rel, "size": info.size, "version": info.version})
            arrays.update({f"{n}/{key}": value for key, value in entry.items()})
        manifest = {"format": FORMAT_VERSION, "files": files}
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **arrays)  # numbers only, as the loader reads them
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".rnb_index_", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(buffer.getvalue())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
