"""Plain MP4 files as a dataset of one-episode videos, so EpisodeByteCache serves them unchanged.

Each file is one episode with one camera, "video", spanning the whole file.
There is no metadata to read, so a file's length and time range come from its
MP4 index, built from range reads the first time the episode is asked for.
"""
from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Sequence

import numpy as np
from fsspec.core import has_magic

from episodes._dataset import EpisodeRecord, VideoSegment, checked_episode
from episodes._errors import DatasetFormatError
from episodes._mp4 import Mp4Index, build_index
from episodes._storage import Storage, StorageOptions, open_filesystem

VIDEO_KEY = "video"


class VideoFilesDataset:
    """Files under one root directory, episode i being the i-th file in sorted order."""

    video_keys: tuple[str, ...] = (VIDEO_KEY,)

    def __init__(self, storage: Storage, paths: Sequence[str]) -> None:
        self.storage = storage
        self.root = storage.root
        self.paths = tuple(paths)
        self._indexes: dict[int, Mp4Index] = {}
        self._lock = threading.Lock()

    @property
    def num_episodes(self) -> int:
        return len(self.paths)

    @property
    def fps(self) -> float:
        """Frame rate of the first file (files of one glob normally share it)."""
        index = self._index(0)
        return index.timescale / float(np.median(index.duration))

    def _check(self, ep: int) -> int:
        return checked_episode(ep, self.num_episodes, self.root, "there are {count} video files")

    def _index(self, ep: int) -> Mp4Index:
        ep = self._check(ep)
        with self._lock:
            index = self._indexes.get(ep)
        if index is None:
            rel = self.paths[ep]
            size = self.storage.info(rel).size
            index = build_index(lambda s, e: self.storage.read_range(rel, s, e), size, name=self.storage.url(rel))
            with self._lock:
                self._indexes[ep] = index
        return index

    def episode_length(self, ep: int) -> int:
        return self._index(ep).num_samples

    def episode(self, ep: int) -> EpisodeRecord:
        index = self._index(ep)
        start = float(index.pts.min()) / index.timescale
        end = float((index.pts + index.duration).max()) / index.timescale
        segment = VideoSegment(VIDEO_KEY, self.paths[ep], start, end)
        return EpisodeRecord(ep, index.num_samples, "", 0, index.num_samples, {VIDEO_KEY: segment})

    def episode_columns(self, ep: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Always an error: plain video files have no data table."""
        ep = self._check(ep)
        raise DatasetFormatError(f"{self.storage.url(self.paths[ep])}: episode {ep}: data columns "
                                 f"{', '.join(map(repr, columns))} were asked for, but plain video files have no data table")


def open_video_files(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, storage_options: StorageOptions | None = None,
    retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 30.0,
) -> VideoFilesDataset:
    """A glob (local or fsspec URL, e.g. "data/*.mp4") or a list of files, as one-episode videos."""
    options = storage_options or {}
    if isinstance(files, (str, os.PathLike)):
        fs, pattern = open_filesystem(os.fspath(files), **options)
        found = sorted(fs.glob(pattern)) if has_magic(pattern) else [pattern]
        urls = [fs.unstrip_protocol(p) for p in found]
        if not urls:
            raise DatasetFormatError(f"{os.fspath(files)}: no video file matches")
    else:
        urls = []
        for f in files:
            fs, path = open_filesystem(os.fspath(f), **options)
            urls.append(fs.unstrip_protocol(path))
        if not urls:
            raise DatasetFormatError("open_video_files: the list of video files is empty")
    root = posixpath.commonpath([u.split("://", 1)[1].rsplit("/", 1)[0] or "/" for u in urls])
    protocol = urls[0].split("://", 1)[0]
    # The user named these files (the glob), so a symlink among them is theirs to follow.
    storage = Storage(f"{protocol}://{root}", storage_options=storage_options, retries=retries,
                      backoff_s=backoff_s, timeout_s=timeout_s, confine=False)
    rels = [u.split("://", 1)[1][len(root):].lstrip("/") for u in urls]
    return VideoFilesDataset(storage, rels)
