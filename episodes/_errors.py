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


def reworded(exc: BaseException, url: str, where: str) -> EpisodeDataError:
    """The lower error re-worded as `<url>: <where>: <reason>`, keeping its class when it is ours.

    Lower layers name the file; the cache adds the episode and camera, and
    an error from outside the package (a decoder's) becomes an Mp4FormatError.
    """
    reason = str(exc)
    if reason.startswith(url + ": "):
        reason = reason[len(url) + 2 :]
    elif not isinstance(exc, EpisodeDataError):
        reason = f"{type(exc).__name__}: {reason}"
    cls = type(exc) if isinstance(exc, EpisodeDataError) else Mp4FormatError
    return cls(f"{url}: {where}: {reason}")
