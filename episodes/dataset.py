"""LeRobot v3.0 metadata: which bytes of which files hold an episode.

Only `meta/info.json` and the small episodes Parquet files are read when a
dataset opens; video and data files are touched later, episode by episode,
through byte ranges and Parquet row groups.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodes.errors import DatasetFormatError, EpisodeDataError
from episodes.storage import Storage, relative_path

INFO_PATH = "meta/info.json"
EPISODES_GLOB = "meta/episodes/chunk-*/file-*.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
CODEBASE_VERSION = "v3.0"
_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index",
                    "dataset_from_index", "dataset_to_index")
_VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


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


def _field(info: dict, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in info:
        raise DatasetFormatError(f"{where}: field {name!r} is missing")
    value = info[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DatasetFormatError(f"{where}: field {name!r} has the wrong type ({type(value).__name__})")
    return value


def checked_episode(ep: Any, count: int, where: str, extent: str) -> int:
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
        self._read_info()
        self._read_episodes()

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
        self.features: dict[str, dict] = features
        self._data_template = _field(info, "data_path", str, where)
        self._video_template = _field(info, "video_path", str, where) if keys else ""

    def _read_episodes(self) -> None:
        files = self.storage.glob(EPISODES_GLOB) or self._probe_episode_files()
        if not files:
            raise DatasetFormatError(f"{self.storage.url('meta/episodes')}: no chunk-*/file-*.parquet files found")
        columns = list(_EPISODE_COLUMNS) + [f"videos/{k}/{f}" for k in self.video_keys for f in _VIDEO_FIELDS]
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

    def _probe_episode_files(self) -> list[str]:
        """Find episodes Parquet files without a listing: LeRobot numbers them densely,
        file after file within a chunk, then the next chunk from file 0."""
        found: list[str] = []
        chunk = file = 0
        while True:
            rel = EPISODES_PATH.format(chunk=chunk, file=file)
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

    def _path(self, template: str, field: str, ep: int, **values: Any) -> str:
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
            prefix = f"videos/{key}/"
            path = self._path(self._video_template, "video_path", ep, video_key=key,
                              chunk_index=int(col[prefix + "chunk_index"][ep]),
                              file_index=int(col[prefix + "file_index"][ep]))
            videos[key] = VideoSegment(key, path, float(col[prefix + "from_timestamp"][ep]),
                                       float(col[prefix + "to_timestamp"][ep]))
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
            for name in [*names, "index"]:
                if name not in schema.names:
                    raise DatasetFormatError(f"{where}: episode {ep}: column {name!r} is missing")
            groups = _row_groups_overlapping(pf, schema.get_field_index("index"), lo, hi)
            table = pf.read_row_groups(groups, columns=list(dict.fromkeys([*names, "index"])))
        except pa.ArrowException as exc:
            raise DatasetFormatError(f"{where}: episode {ep}: not a readable Parquet file ({exc})") from exc
        index = table.column("index").to_numpy()
        start, stop = np.searchsorted(index, [lo, hi])
        if stop - start != record.length or not np.array_equal(index[start:stop], np.arange(lo, hi)):
            raise DatasetFormatError(
                f"{where}: episode {ep}: column 'index' does not hold rows {lo}..{hi - 1} in order"
            )
        return table.slice(start, stop - start).select(names)


def _row_groups_overlapping(pf: pq.ParquetFile, column: int, lo: int, hi: int) -> list[int]:
    """Row groups whose `index` statistics overlap [lo, hi); all of them when statistics are absent."""
    groups = []
    for g in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or (stats.min < hi and stats.max >= lo):
            groups.append(g)
    return groups


def column_array(table: pa.Table, name: str) -> np.ndarray:
    """A fixed-size-list column (state, action) as an (N, D) numpy array.

    Zero-copy when the column is one contiguous chunk (an episode inside one
    row group); episodes spanning row groups cost one concatenation.
    """
    column = table.column(name)
    if not pa.types.is_fixed_size_list(column.type):
        raise EpisodeDataError(f"column {name!r} is {column.type}, not a fixed-size list")
    if column.null_count or any(chunk.values.null_count for chunk in column.chunks):
        raise EpisodeDataError(f"column {name!r} has null values")
    width = column.type.list_size
    parts = [chunk.flatten().to_numpy(zero_copy_only=True).reshape(-1, width) for chunk in column.chunks]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty((0, width), column.type.value_type.to_pandas_dtype())


def open_dataset(
    root: str,
    *,
    storage_options: dict[str, Any] | None = None,
    retries: int = 3,
    backoff_s: float = 0.2,
    timeout_s: float = 30.0,
) -> LeRobotDataset:
    """Open a LeRobot v3.0 dataset at a local path or any fsspec URL."""
    storage = Storage(str(root), storage_options=storage_options, retries=retries,
                      backoff_s=backoff_s, timeout_s=timeout_s)
    return LeRobotDataset(storage)
