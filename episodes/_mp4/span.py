"""EpisodeSpan: which samples, and so which bytes, one episode needs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodes._errors import Mp4FormatError
from episodes._mp4.index import Mp4Index


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


def decode_starts(index: Mp4Index, samples: np.ndarray, shown: np.ndarray | None = None) -> np.ndarray:
    """For each sample, the sync sample where decoding must start so that it, and any frame shown from `shown` on, decode.

    That is the last sync sample at or before the sample in decode order
    that is shown no later than `shown` (default: when the sample itself is
    shown). A sync sample shown later, an open-GOP CRA whose leading
    pictures reference the GOP before it, cannot be decoding's start, so
    decoding steps back to an earlier one.
    """
    samples = np.asarray(samples, dtype=np.int64)
    shown = index.pts[samples] if shown is None else np.asarray(shown, dtype=np.int64)
    sync = np.flatnonzero(index.is_sync)
    k = np.searchsorted(sync, samples, side="right") - 1
    while True:  # a step back per leading picture in the way: once or twice at most
        late = (k >= 0) & (index.pts[sync[np.maximum(k, 0)]] > shown) if len(sync) else np.zeros(len(k), bool)
        if not late.any():
            break
        k = k - late
    if (k < 0).any():
        first = int(shown[np.flatnonzero(k < 0)[0]])
        raise Mp4FormatError(f"{index.name}: no sync sample precedes the frame at {first / index.timescale} s")
    return sync[k]


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
    seconds, half_frame = index.pts_seconds, index.half_frame_s
    inside = (seconds >= from_timestamp - half_frame) & (seconds < to_timestamp - half_frame)
    needed = np.flatnonzero(inside)
    if expected_frames is not None and len(needed) != expected_frames:
        raise Mp4FormatError(
            f"{index.name}: [{from_timestamp}, {to_timestamp}) s holds {len(needed)} frames, "
            f"expected {expected_frames}"
        )
    if len(needed) == 0:
        raise Mp4FormatError(f"{index.name}: no frame is presented in [{from_timestamp}, {to_timestamp}) s")
    start = int(decode_starts(index, needed[:1], index.pts[needed].min(keepdims=True))[0])
    stop = int(needed[-1]) + 1
    order = needed[np.argsort(index.pts[needed], kind="stable")]
    return EpisodeSpan(
        sample_start=start,
        sample_stop=stop,
        byte_start=int(index.offset[start:stop].min()),
        byte_end=int((index.offset[start:stop] + index.size[start:stop]).max()),
        frames=tuple(order.tolist()),
    )
