"""EpisodeSpan: which samples, and so which bytes, one episode needs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodes._mp4.index import Mp4Index
from episodes.errors import Mp4FormatError


@dataclass(frozen=True)
class EpisodeSpan:
    """The decode-order run [sample_start, sample_stop) that presents an episode.

    The run starts at a sync sample so decoding can begin there, and ends at
    the last sample any episode frame depends on. `frames` lists the episode's
    own samples in presentation order: episode frame i is sample frames[i].
    [byte_start, byte_end) covers every sample of the run (and whatever other
    tracks interleave between them).
    """

    sample_start: int
    sample_stop: int
    byte_start: int
    byte_end: int
    frames: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return self.byte_end - self.byte_start


def episode_span(
    index: Mp4Index, from_timestamp: float, to_timestamp: float, *, expected_frames: int | None = None
) -> EpisodeSpan:
    """The span of the frames presented in [from_timestamp, to_timestamp) seconds.

    A frame belongs to the episode when its presentation time lies in the
    interval shifted back by half a frame, so accumulated-float bounds such as
    9.533333333333333 still select whole frames.
    """
    if index.num_samples == 0:
        raise Mp4FormatError(f"{index.name}: video track has no samples")
    seconds = index.pts / index.timescale
    half_frame = 0.5 * float(np.median(index.duration)) / index.timescale
    inside = (seconds >= from_timestamp - half_frame) & (seconds < to_timestamp - half_frame)
    needed = np.flatnonzero(inside)
    if expected_frames is not None and len(needed) != expected_frames:
        raise Mp4FormatError(
            f"{index.name}: [{from_timestamp}, {to_timestamp}) s holds {len(needed)} frames, "
            f"expected {expected_frames}"
        )
    if len(needed) == 0:
        raise Mp4FormatError(f"{index.name}: no frame is presented in [{from_timestamp}, {to_timestamp}) s")
    first_shown = index.pts[needed].min()
    # A sync sample shown after a needed frame (an open-GOP CRA with leading
    # pictures) cannot be decoding's start: those leading pictures reference
    # the GOP before it, so step back to an earlier sync sample.
    starts = np.flatnonzero(index.is_sync[: needed[0] + 1] & (index.pts[: needed[0] + 1] <= first_shown))
    if len(starts) == 0:
        raise Mp4FormatError(f"{index.name}: no sync sample precedes the frame at {first_shown / index.timescale} s")
    start, stop = int(starts[-1]), int(needed[-1]) + 1
    order = needed[np.argsort(index.pts[needed], kind="stable")]
    return EpisodeSpan(
        sample_start=start,
        sample_stop=stop,
        byte_start=int(index.offset[start:stop].min()),
        byte_end=int((index.offset[start:stop] + index.size[start:stop]).max()),
        frames=tuple(int(i) for i in order),
    )
