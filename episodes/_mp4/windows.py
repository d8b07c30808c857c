"""Frame windows: the samples, and so the bytes, that some frames of an episode need, and nothing more.

A frame needs the decode-order run from the sync sample decoding must start
at (episodes._mp4.span.decode_starts, which steps back past open-GOP
leading pictures) up to the frame's own sample: every picture it references
was decoded before it. B-frames shown before a later-decoded anchor are
covered because their window runs to their own decode position, which lies
after that anchor's. Windows that overlap or touch merge into runs; a
mini-MP4 of the runs' samples decodes each asked-for frame bit-identically.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodes._mp4.index import Mp4Index
from episodes._mp4.span import EpisodeSpan, decode_starts


@dataclass(frozen=True)
class SampleRun:
    """Samples [start, stop) in decode order, held by file bytes [byte_start, byte_end)."""

    start: int
    stop: int
    byte_start: int
    byte_end: int

    @property
    def num_bytes(self) -> int:
        return self.byte_end - self.byte_start


@dataclass(frozen=True, eq=False)
class FrameWindows:
    """What frames `frame_numbers` of one episode-camera need.

    `windows` holds one run per frame (keyframe to frame, as LeRobot's
    random-frame benchmark counts them); `runs` merges those that overlap or
    touch, in decode order. `useful_bytes` is the size of the distinct
    samples of the runs, what decoding the frames really uses.
    """

    frame_numbers: np.ndarray
    frame_samples: np.ndarray
    windows: tuple[SampleRun, ...]
    runs: tuple[SampleRun, ...]
    useful_bytes: int

    @property
    def planned_bytes(self) -> int:
        """Bytes of the windows one by one, before any merging."""
        return sum(w.num_bytes for w in self.windows)

    @property
    def samples(self) -> np.ndarray:
        """Every sample of the runs, ascending."""
        return np.concatenate([np.arange(r.start, r.stop) for r in self.runs]) if self.runs else np.zeros(0, np.int64)


def frame_windows(index: Mp4Index, span: EpisodeSpan, frame_numbers: np.ndarray) -> FrameWindows:
    """The windows and merged runs for episode frames `frame_numbers` (0-based, valid for `span`)."""
    numbers = np.unique(np.asarray(frame_numbers, dtype=np.int64))
    targets = np.asarray(span.frames, dtype=np.int64)[numbers]
    starts = decode_starts(index, targets)
    windows = _runs(index, starts, targets + 1)
    order = np.argsort(starts, kind="stable")
    merged_start: list[int] = []
    merged_stop: list[int] = []
    for start, stop in zip(starts[order].tolist(), (targets[order] + 1).tolist()):
        if merged_stop and start <= merged_stop[-1]:
            merged_stop[-1] = max(merged_stop[-1], stop)
        else:
            merged_start.append(start)
            merged_stop.append(stop)
    runs = _runs(index, np.asarray(merged_start, np.int64), np.asarray(merged_stop, np.int64))
    useful = sum(int(index.size[r.start : r.stop].sum()) for r in runs)
    return FrameWindows(numbers, targets, windows, runs, useful)


def _runs(index: Mp4Index, starts: np.ndarray, stops: np.ndarray) -> tuple[SampleRun, ...]:
    """Runs [starts[i], stops[i]) with the byte range each occupies in the file."""
    ends = index.offset + index.size
    if np.all(np.diff(index.offset) > 0) and np.all(ends[:-1] <= index.offset[1:]):
        # One track stored in decode order, the usual case: a run's bytes are its first and last samples'.
        lo, hi = index.offset[starts], ends[stops - 1]
    else:
        lo = np.array([index.offset[a:b].min() for a, b in zip(starts.tolist(), stops.tolist())], np.int64)
        hi = np.array([ends[a:b].max() for a, b in zip(starts.tolist(), stops.tolist())], np.int64)
    return tuple(SampleRun(int(a), int(b), int(c), int(d))
                 for a, b, c, d in zip(starts.tolist(), stops.tolist(), lo.tolist(), hi.tolist()))
