"""Where an episode's frames lie: its record, its video file's MP4 index, its span in that file.

A cache asks this for every read it plans. Each file's index is built at
most once per cache, from the file's headers (range reads) or, with a
sidecar (episodes._sidecar), loaded from what an earlier run stored,
provided the file is still the one it indexed.

Checking that costs a round trip of its own (the file's size and version)
before anything can be read. Over HTTP every range answer states both
(storage.RangeAnswer), so there a sidecar's index is used at once, with a
FileClaim: the first answer a reader takes of that file settles it, before
any byte of it is cut or decoded. A claim found false drops the index; the
reads planned with it raise StaleIndex and are planned and read again, from
an index built from the file as it is now, as a stale sidecar entry always
was.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from episodes._dataset import EpisodeRecord
from episodes._mp4 import Mp4Index, build_index, episode_span
from episodes._mp4.span import EpisodeSpan
from episodes._once import OncePerKey
from episodes._reads import Counts
from episodes._sidecar import IndexSidecar
from episodes._source import EpisodeDataset
from episodes._storage import FileInfo, Storage


class StaleIndex(Exception):
    """A read planned with a sidecar's index of a file that has changed since: to be planned and read again."""


class FileClaim:
    """A sidecar's unchecked claim that file `rel` is still `expected`, settled once by the first answer taken.

    An answer that does not state the file as the sidecar recorded it
    (another filesystem, no size, no version where the sidecar has one) is
    settled by asking the file's info, the round trip the claim saved
    otherwise. `on_stale` runs once, where the claim is false.
    """

    def __init__(self, storage: Storage, rel: str, expected: FileInfo, on_stale: Callable[[FileClaim], None]) -> None:
        self._storage, self.rel, self._expected, self._on_stale = storage, rel, expected, on_stale
        self._lock = threading.Lock()
        self._holds: bool | None = None

    def settle(self, answered: FileInfo | None) -> None:
        """Raise StaleIndex unless the file is the one indexed, as `answered` (a range answer's view) says."""
        with self._lock:
            if self._holds is None:
                says = answered is not None and (answered.version is not None or self._expected.version is None)
                seen = answered if says else self._storage.info(self.rel)
                self._holds = seen == self._expected
                if not self._holds:
                    self._on_stale(self)
        if not self._holds:
            raise StaleIndex(self.rel)


@dataclass(frozen=True, eq=False)
class Located:
    """Where an episode-camera's frames lie: its file's index, its span in it, and the index's claim, if unchecked."""

    index: Mp4Index
    span: EpisodeSpan
    claim: FileClaim | None


@dataclass(frozen=True, eq=False)
class _Indexed:
    index: Mp4Index
    claim: FileClaim | None


class FileIndexes:
    """The records, indexes and spans a cache over `ds` plans its reads with (see the module)."""

    def __init__(self, ds: EpisodeDataset, sidecar_path: Path | None, counts: Counts) -> None:
        self._ds, self._storage, self._counts = ds, ds.storage, counts
        self._sidecar_path = sidecar_path
        self._sidecar: IndexSidecar | None = None
        self._lock = threading.Lock()
        self._indexes: OncePerKey[str, _Indexed] = OncePerKey(keep=True)
        self._stale: set[str] = set()  # files whose sidecar entry a range answer found stale: checked first now

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

    def span(self, record: EpisodeRecord, key: str) -> Located:
        """The index of the episode-camera's file and where the episode lies in it."""
        segment = record.videos[key]
        indexed = self._index(segment.path)
        span = episode_span(indexed.index, segment.from_timestamp, segment.to_timestamp, expected_frames=record.length)
        return Located(indexed.index, span, indexed.claim)

    def index_files(self, paths: Iterable[str], io: Executor) -> None:
        """The index of each file ready now, the files indexed concurrently on `io`."""
        for _ in io.map(self._index, list(dict.fromkeys(paths))):
            pass

    def _index(self, rel: str) -> _Indexed:
        """The index of video file `rel`, built at most once per cache (and once per dataset with the sidecar)."""
        return self._indexes.get(rel, lambda: self._load(rel))[0]

    def _load(self, rel: str) -> _Indexed:
        url = self._storage.url(rel)
        sidecar = self._open_sidecar()
        if sidecar is not None and self._storage.ranges_say_file and rel not in self._stale:
            stored = sidecar.stored(rel, name=url)
            if stored is not None:
                self._counts.add(index_sidecar_loads=1)
                return _Indexed(stored[1], FileClaim(self._storage, rel, stored[0], self._stale_claim))
        info = self._storage.info(rel)
        index = sidecar.lookup(rel, info, name=url) if sidecar else None
        if index is not None:
            self._counts.add(index_sidecar_loads=1)
            return _Indexed(index, None)

        def read(start: int, end: int) -> bytes:
            data = self._storage.read_range(rel, start, end)
            self._counts.add(header_reads=1, header_bytes=len(data))
            return data

        index = build_index(read, info.size, name=url)
        self._counts.add(index_builds=1)
        if sidecar:
            sidecar.store(rel, info, index)
        return _Indexed(index, None)

    def _stale_claim(self, claim: FileClaim) -> None:
        """A sidecar's index found stale: forgotten, and its file's next index checked against the file first."""
        self._stale.add(claim.rel)
        self._indexes.forget(claim.rel, lambda indexed: indexed.claim is claim)
        self._counts.add(index_sidecar_loads=-1, index_sidecar_stale=1)

    def _open_sidecar(self) -> IndexSidecar | None:
        if self._sidecar_path is None:
            return None
        with self._lock:
            if self._sidecar is None:
                self._sidecar = IndexSidecar(self._sidecar_path)
            return self._sidecar
