"""What the rest of RnB may ask of a dataset, and the one function that opens either kind.

A LeRobot v3.0 dataset and a glob of plain video files both answer the
EpisodeDataset protocol, so the cache, the loaders and the request source
are written once against it and never test which kind they hold.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from fsspec.core import has_magic

from episodes._dataset import EpisodeRecord, open_dataset
from episodes._storage import Storage, StorageSettings
from episodes._video_files import open_video_files

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11's; never imported at run time (annotations stay strings)

SourceKind = Literal["dataset", "videos"]
KINDS: tuple[SourceKind, ...] = ("dataset", "videos")


class EpisodeDataset(Protocol):
    """Episodes with cameras: LeRobotDataset and VideoFilesDataset both fit.

    Episode indices run 0..num_episodes-1; an index outside raises
    DatasetFormatError naming the root.
    """

    storage: Storage
    root: str
    video_keys: tuple[str, ...]

    @property
    def fps(self) -> float:
        """Frames per second (of the first file, for plain video files)."""
        ...

    @property
    def num_episodes(self) -> int: ...

    def episode_length(self, ep: int) -> int:
        """Frames in episode `ep`."""
        ...

    def episode(self, ep: int) -> EpisodeRecord:
        """Where episode `ep`'s video segments and data rows lie."""
        ...

    def episode_columns(self, ep: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """The episode's rows of numeric data columns; a dataset without a data table raises DatasetFormatError."""
        ...


def guess_kind(location: str | os.PathLike[str]) -> SourceKind:
    """"videos" for a glob or an .mp4 path, else "dataset" (a LeRobot root)."""
    text = os.fspath(location)
    return "videos" if has_magic(text) or text.lower().endswith(".mp4") else "dataset"


def open_episodes(location: str | os.PathLike[str], kind: SourceKind | None = None, *,
                  usage_cache_dir: str | os.PathLike[str] | None = None,
                  **storage: Unpack[StorageSettings]) -> EpisodeDataset:
    """A LeRobot dataset root or a glob of video files (local or any fsspec URL) as an EpisodeDataset.

    `kind` None guesses from the location (guess_kind). `usage_cache_dir`
    applies to LeRobot datasets (see open_dataset); `storage` holds
    storage_options, retries, backoff_s and timeout_s.
    """
    kind = guess_kind(location) if kind is None else kind
    if kind == "dataset":
        return open_dataset(os.fspath(location), usage_cache_dir=usage_cache_dir, **storage)
    if kind == "videos":
        return open_video_files(location, **storage)
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
