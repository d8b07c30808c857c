"""The exceptions of the episodes package.

Each message is one sentence naming the file (and the episode or field where
one is known), so a CLI can print it as is.
"""
from __future__ import annotations


class EpisodeDataError(Exception):
    """Base class: something about the dataset, its files or their bytes is wrong."""


class DatasetFormatError(EpisodeDataError):
    """Metadata (info.json, episodes Parquet, path templates) is missing or malformed."""


class Mp4FormatError(EpisodeDataError):
    """An MP4 file is truncated, corrupt, or uses a layout we do not support."""


class FetchError(EpisodeDataError):
    """Bytes could not be read from storage (missing file, short read, HTTP error, timeout)."""
