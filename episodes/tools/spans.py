"""What an episode's bytes are in its video file: its own samples, their range, and the range a whole-episode fetch reads.

For measuring a dataset's layout (RnB's benchmarks P2 and P2r): a read
reports what it fetched and what it used, but not how much of its range is
keyframe widening or other data interleaved between the episode's own
samples; these figures say so, from the file's MP4 index.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from episodes import EpisodeDataset
from episodes._mp4 import Mp4Index, build_index, episode_span


@dataclass(frozen=True)
class EpisodeBytes:
    """One episode-camera's bytes in its video file."""

    own: int
    """The sizes of the episode's own samples, added up: what decoding it uses."""
    tight: int
    """The byte range from its first own sample to its last, without keyframe widening."""
    widened: int
    """The range a whole-episode fetch reads: back to the keyframe its decoding starts at."""


def episode_bytes(ds: EpisodeDataset, episodes: Iterable[int], key: str) -> list[EpisodeBytes]:
    """The bytes of camera `key` of each of `episodes`; each file's index is built once, from its headers."""
    indexes: dict[str, Mp4Index] = {}
    out = []
    for ep in episodes:
        segment = ds.episode(ep).videos[key]
        rel = segment.path
        if rel not in indexes:
            indexes[rel] = build_index(lambda start, end: ds.storage.read_range(rel, start, end),
                                       ds.storage.info(rel).size, name=ds.storage.url(rel))
        index = indexes[rel]
        span = episode_span(index, segment.from_timestamp, segment.to_timestamp, expected_frames=ds.episode_length(ep))
        own = np.asarray(span.frames)
        out.append(EpisodeBytes(own=int(index.size[own].sum()),
                                tight=int((index.offset[own] + index.size[own]).max() - index.offset[own].min()),
                                widened=span.num_bytes))
    return out
