"""Where an episode's frames lie: its record, its video file's MP4 index, its span in that file.

A cache asks this for every read it plans. Each file's index is built at
most once per cache, from the file's headers (range reads) or, with a
sidecar (episodes._sidecar), loaded from what an earlier run stored,
once the sidecar has checked that the file is still the one it indexed.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path

from episodes._dataset import EpisodeRecord
from episodes._mp4 import Mp4Index, build_index, episode_span
from episodes._mp4.span import EpisodeSpan
from episodes._once import OncePerKey
from episodes._reads import Counts
from episodes._sidecar import IndexSidecar
from episodes._source import EpisodeDataset


class FileIndexes:
    """The records, indexes and spans a cache over `ds` plans its reads with (see the module)."""

    def __init__(self, ds: EpisodeDataset, sidecar_path: Path | None, counts: Counts) -> None:
        self._ds, self._storage, self._counts = ds, ds.storage, counts
        self._sidecar_path = sidecar_path
        self._sidecar: IndexSidecar | None = None
        self._lock = threading.Lock()
        self._indexes: OncePerKey[str, Mp4Index] = OncePerKey(keep=True)

    def record(self, ep: int, key: str) -> EpisodeRecord:
        """Episode `ep`'s record; a camera it does not have is a ValueError naming the cameras it has."""
        record = self._ds.episode(ep)
        if key not in record.videos:
            raise ValueError(f"{self._storage.root}: episode {ep}: camera {key!r} is not one of "
                             f"{', '.join(record.videos)}")
        return record

    def where(self, record: EpisodeRecord, key: str) -> str:
        """How a message names the episode-camera: its video file's URL, the episode and the camera."""
        return f"{self._storage.url(record.videos[key].path)}: episode {record.index}, camera {key}"

    def span(self, record: EpisodeRecord, key: str) -> tuple[Mp4Index, EpisodeSpan]:
        """The index of the episode-camera's file and where the episode lies in it."""
        segment = record.videos[key]
        index = self.index(segment.path)
        return index, episode_span(index, segment.from_timestamp, segment.to_timestamp, expected_frames=record.length)

    def index(self, rel: str) -> Mp4Index:
        """The index of video file `rel`, built at most once per cache (and once per dataset with the sidecar)."""
        return self._indexes.get(rel, lambda: self._load(rel))[0]

    def index_files(self, paths: Iterable[str], io: Executor) -> None:
        """The index of each file ready now, the files indexed concurrently on `io`."""
        for _ in io.map(self.index, list(dict.fromkeys(paths))):
            pass

    def _load(self, rel: str) -> Mp4Index:
        url = self._storage.url(rel)
        info = self._storage.info(rel)
        sidecar = self._open_sidecar()
        index = sidecar.lookup(rel, info, name=url) if sidecar else None
        if index is not None:
            self._counts.add(index_sidecar_loads=1)
            return index

        def read(start: int, end: int) -> bytes:
            data = self._storage.read_range(rel, start, end)
            self._counts.add(header_reads=1, header_bytes=len(data))
            return data

        index = build_index(read, info.size, name=url)
        self._counts.add(index_builds=1)
        if sidecar:
            sidecar.store(rel, info, index)
        return index

    def _open_sidecar(self) -> IndexSidecar | None:
        if self._sidecar_path is None:
            return None
        with self._lock:
            if self._sidecar is None:
                self._sidecar = IndexSidecar(self._sidecar_path)
            return self._sidecar
