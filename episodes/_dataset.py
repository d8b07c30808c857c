"""LeRobot v3.0 metadata: which bytes of which files hold an episode.

Only `meta/info.json` and the small episodes Parquet files are read when a
dataset opens; video and data files are touched later, episode by episode,
through byte ranges and Parquet row groups.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodes._errors import DatasetFormatError
from episodes._layout import (
    CODEBASE_VERSION,
    EPISODE_COLUMNS,
    EPISODES_GLOB,
    EPISODES_PATH,
    INFO_PATH,
    ROW_INDEX,
    VIDEO_FIELDS,
    video_column,
)
from episodes._storage import Storage, StorageOptions, relative_path
from episodes._tabular import UsageCache, column_array

T = TypeVar("T")


@dataclass(frozen=True)
class VideoSegment:
    """Where one camera's frames of an episode lie: a time interval of one MP4."""

    key: str
    path: str
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode: its data file rows [dataset_from_index, dataset_to_index) and its video segments."""

    index: int
    length: int
    data_path: str
    dataset_from_index: int
    dataset_to_index: int
    videos: Mapping[str, VideoSegment]


def _field(info: dict[str, object], name: str, kind: type[T] | tuple[type[T], ...], where: str) -> T:
    if name not in info:
        raise DatasetFormatError(f"{where}: field {name!r} is missing")
    value = info[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DatasetFormatError(f"{where}: field {name!r} has the wrong type ({type(value).__name__})")
    return value


def checked_episode(ep: object, count: int, where: str, extent: str) -> int:
    """`ep` as an int when it indexes one of `count` episodes; else the error naming `where`."""
    if isinstance(ep, bool) or not isinstance(ep, (int, np.integer)) or not 0 <= ep < count:
        raise DatasetFormatError(f"{where}: episode index {ep!r} is out of range ({extent.format(count=count)})")
    return int(ep)


class LeRobotDataset:
    """The metadata of a LeRobot v3.0 dataset, read through one Storage.

    Episode columns are kept as numpy arrays; records are built on demand so
    that opening a dataset of 100k episodes stays cheap.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.root = storage.root
        self.usage_cache: UsageCache | None = None
        self._data_files: dict[tuple[int, int], str] = {}
        self._read_info()
        self._read_episodes()
        self._check_paths()

    def _read_info(self) -> None:
        where = self.storage.url(INFO_PATH)
        try:
            info = json.loads(self.storage.read_bytes(INFO_PATH))
        except (ValueError, UnicodeDecodeError) as exc:
            raise DatasetFormatError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(info, dict):
            raise DatasetFormatError(f"{where}: expected a JSON object at the top level")
        version = _field(info, "codebase_version", str, where)
        if version != CODEBASE_VERSION:
            raise DatasetFormatError(
                f"{where}: field 'codebase_version' is {version!r}; only {CODEBASE_VERSION!r} is supported"
            )
        fps = _field(info, "fps", (int, float), where)
        if fps <= 0:
            raise DatasetFormatError(f"{where}: field 'fps' must be positive, got {fps}")
        features = _field(info, "features", dict, where)
        keys = []
        for name, feature in features.items():
            if not isinstance(feature, dict) or not isinstance(feature.get("dtype"), str):
                raise DatasetFormatError(f"{where}: field 'features.{name}.dtype' is missing or not a string")
            if feature["dtype"] == "video":
                keys.append(name)
        self.fps = float(fps)
        self.video_keys: tuple[str, ...] = tuple(keys)
        self.features: dict[str, dict[str, object]] = features
        self._data_template = _field(info, "data_path", str, where)
        self._video_template = _field(info, "video_path", str, where) if keys else ""

    def _read_episodes(self) -> None:
        files = self.storage.glob(EPISODES_GLOB) or self._probe_episode_files()
        if not files:
            raise DatasetFormatError(f"{self.storage.url('meta/episodes')}: no chunk-*/file-*.parquet files found")
        columns = list(EPISODE_COLUMNS) + [video_column(k, f) for k in self.video_keys for f in VIDEO_FIELDS]
        tables = [self._read_episode_file(rel, columns) for rel in files]
        table = pa.concat_tables(tables).sort_by("episode_index")
        self._columns = {name: table.column(name).to_numpy() for name in columns}
        where = self.storage.url("meta/episodes")
        indices = self._columns["episode_index"]
        if not np.array_equal(indices, np.arange(len(indices))):
            raise DatasetFormatError(f"{where}: field 'episode_index' is not 0..{len(indices) - 1} without gaps")
        spans = self._columns["dataset_to_index"] - self._columns["dataset_from_index"]
        bad = np.flatnonzero(spans != self._columns["length"])
        if bad.size:
            raise DatasetFormatError(
                f"{where}: episode {int(bad[0])}: field 'length' disagrees with dataset_to_index - dataset_from_index"
            )

    def _check_paths(self) -> None:
        """Format every distinct file path the episodes table leads to, once, when the dataset opens.

        A template or index that leaves the root (or, on local disk, a file
        that is a symlink out of it) is then refused before anything runs,
        not at the first episode that happens to use it.
        """
        col = self._columns
        wanted: list[tuple[str, str, str, str, dict[str, str]]] = [
            (self._data_template, "data_path", "data/chunk_index", "data/file_index", {})]
        wanted += [(self._video_template, "video_path", video_column(key, "chunk_index"),
                    video_column(key, "file_index"), {"video_key": key}) for key in self.video_keys]
        for template, field, chunks, files, values in wanted:
            pairs = np.stack([col[chunks], col[files]], axis=1)
            _, firsts = np.unique(pairs, axis=0, return_index=True)
            for ep in firsts:
                rel = self._path(template, field, int(ep), chunk_index=int(pairs[ep, 0]),
                                 file_index=int(pairs[ep, 1]), **values)
                self.storage.path(rel)

    def _probe_episode_files(self) -> list[str]:
        """Find episodes Parquet files without a listing: LeRobot numbers them densely,
        file after file within a chunk, then the next chunk from file 0."""
        found: list[str] = []
        chunk = file = 0
        while True:
            rel = EPISODES_PATH.format(chunk_index=chunk, file_index=file)
            if self.storage.exists(rel):
                found.append(rel)
                file += 1
            elif file > 0:
                chunk, file = chunk + 1, 0
            else:
                return found

    def _read_episode_file(self, rel: str, columns: list[str]) -> pa.Table:
        where = self.storage.url(rel)
        try:
            table = pq.read_table(pa.BufferReader(self.storage.read_bytes(rel)))
        except pa.ArrowException as exc:
            raise DatasetFormatError(f"{where}: not a readable Parquet file ({exc})") from exc
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DatasetFormatError(f"{where}: field {missing[0]!r} is missing")
        table = table.select(columns)
        for name in columns:
            if table.column(name).null_count:
                raise DatasetFormatError(f"{where}: field {name!r} has null values")
        return table

    @property
    def num_episodes(self) -> int:
        return len(self._columns["episode_index"])

    def _check(self, ep: int) -> int:
        return checked_episode(ep, self.num_episodes, self.root, "the dataset has {count} episodes")

    def episode_length(self, ep: int) -> int:
        return int(self._columns["length"][self._check(ep)])

    def _path(self, template: str, field: str, ep: int, **values: object) -> str:
        where = self.storage.url(INFO_PATH)
        try:
            rel = template.format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            raise DatasetFormatError(f"{where}: field {field!r} is not a valid path template ({exc!r})") from exc
        try:
            return relative_path(rel)
        except DatasetFormatError as exc:
            raise DatasetFormatError(
                f"{where}: field {field!r} gives {rel!r} for episode {ep}, which is outside the dataset root"
            ) from exc

    def episode(self, ep: int) -> EpisodeRecord:
        ep = self._check(ep)
        col = self._columns
        videos = {}
        for key in self.video_keys:
            path = self._path(self._video_template, "video_path", ep, video_key=key,
                              chunk_index=int(col[video_column(key, "chunk_index")][ep]),
                              file_index=int(col[video_column(key, "file_index")][ep]))
            videos[key] = VideoSegment(key, path, float(col[video_column(key, "from_timestamp")][ep]),
                                       float(col[video_column(key, "to_timestamp")][ep]))
        data_path = self._path(self._data_template, "data_path", ep,
                               chunk_index=int(col["data/chunk_index"][ep]),
                               file_index=int(col["data/file_index"][ep]))
        return EpisodeRecord(ep, int(col["length"][ep]), data_path, int(col["dataset_from_index"][ep]),
                             int(col["dataset_to_index"][ep]), videos)

    def episode_table(self, ep: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The episode's rows of its data Parquet, reading only the row groups that hold them."""
        record = self.episode(ep)
        where = self.storage.url(record.data_path)
        lo, hi = record.dataset_from_index, record.dataset_to_index
        try:
            pf = self.storage.open_parquet(record.data_path)
            schema = pf.schema_arrow
            names = list(columns) if columns is not None else schema.names
            _check_columns(schema.names, [*names, ROW_INDEX], f"{where}: episode {ep}")
            groups = _row_groups_overlapping(pf, schema.get_field_index(ROW_INDEX), lo, hi)
            table = pf.read_row_groups(groups, columns=list(dict.fromkeys([*names, ROW_INDEX])))
        except pa.ArrowException as exc:
            raise DatasetFormatError(f"{where}: episode {ep}: not a readable Parquet file ({exc})") from exc
        start, stop = _episode_rows(table.column(ROW_INDEX).to_numpy(), record, where)
        return table.slice(start, stop - start).select(names)

    def use_usage_cache(self, cache_dir: str | PathLike[str]) -> None:
        """Serve episode_columns from usage-format copies kept under `cache_dir` (episodes._tabular) from now on."""
        self.usage_cache = UsageCache(self.storage, cache_dir)

    def episode_columns(self, ep: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """The episode's rows of numeric data columns as numpy arrays ((N,) or (N, D) for fixed-size lists).

        From the usage-format cache when one is in use (a memmap slice),
        else from the Parquet row groups that hold the episode.
        """
        ep = self._check(ep)
        if self.usage_cache is None:
            table = self.episode_table(ep, columns)
            where = f"{self.storage.url(self.episode(ep).data_path)}: episode {ep}"
            return {name: column_array(table.column(name), name, where) for name in columns}
        rel = self._data_file(ep)
        arrays = self.usage_cache.columns(rel, columns, lambda names: self._whole_columns(rel, names))
        index = arrays[ROW_INDEX]
        lo, hi = int(self._columns["dataset_from_index"][ep]), int(self._columns["dataset_to_index"][ep])
        start = int(np.searchsorted(index, lo))
        # The usage cache checked once that the index column strictly increases, so the ends suffice.
        n = hi - lo
        if n and not (start + n <= len(index) and index[start] == lo and index[start + n - 1] == hi - 1):
            raise DatasetFormatError(f"{self.storage.url(rel)}: episode {ep}: column {ROW_INDEX!r} does not hold "
                                     f"rows {lo}..{hi - 1}")
        return {name: arrays[name][start : start + n] for name in columns}

    def _data_file(self, ep: int) -> str:
        """The episode's data file, its path formatted once per (chunk, file)."""
        where = (int(self._columns["data/chunk_index"][ep]), int(self._columns["data/file_index"][ep]))
        rel = self._data_files.get(where)
        if rel is None:
            rel = self._data_files[where] = self._path(self._data_template, "data_path", ep, chunk_index=where[0],
                                                       file_index=where[1])
        return rel

    def _whole_columns(self, rel: str, names: list[str]) -> pa.Table:
        where = self.storage.url(rel)
        try:
            pf = self.storage.open_parquet(rel)
            _check_columns(pf.schema_arrow.names, names, where)
            return pf.read(columns=names)
        except pa.ArrowException as exc:
            raise DatasetFormatError(f"{where}: not a readable Parquet file ({exc})") from exc


def _check_columns(present: Sequence[str], names: Sequence[str], where: str) -> None:
    for name in names:
        if name not in present:
            raise DatasetFormatError(f"{where}: column {name!r} is missing")


def _episode_rows(index: np.ndarray, record: EpisodeRecord, where: str) -> tuple[int, int]:
    """Positions [start, stop) of the episode's rows in a data file's row-index column, checked."""
    lo, hi = record.dataset_from_index, record.dataset_to_index
    start, stop = (int(i) for i in np.searchsorted(index, [lo, hi]))
    if stop - start != record.length or not np.array_equal(index[start:stop], np.arange(lo, hi)):
        raise DatasetFormatError(
            f"{where}: episode {record.index}: column {ROW_INDEX!r} does not hold rows {lo}..{hi - 1} in order"
        )
    return start, stop


def _row_groups_overlapping(pf: pq.ParquetFile, column: int, lo: int, hi: int) -> list[int]:
    """Row groups whose `index` statistics overlap [lo, hi); all of them when statistics are absent."""
    groups = []
    for g in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or (stats.min < hi and stats.max >= lo):
            groups.append(g)
    return groups


def open_dataset(
    root: str,
    *,
    storage_options: StorageOptions | None = None,
    retries: int = 3,
    backoff_s: float = 0.2,
    timeout_s: float = 30.0,
    usage_cache_dir: str | PathLike[str] | None = None,
) -> LeRobotDataset:
    """Open a LeRobot v3.0 dataset at a local path or any fsspec URL.

    With `usage_cache_dir`, episode_columns serves memmapped copies of the
    data columns kept in that directory (the usage-format cache); without,
    it reads the Parquet row groups every time and writes nothing.
    """
    storage = Storage(str(root), storage_options=storage_options, retries=retries,
                      backoff_s=backoff_s, timeout_s=timeout_s)
    ds = LeRobotDataset(storage)
    if usage_cache_dir is not None:
        ds.use_usage_cache(usage_cache_dir)
    return ds
