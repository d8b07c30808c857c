"""What one read of episode frames asks, returns and costs, and how its frames are named: the cache's records.

Kept apart from episodes._cache so that the records read alone, in the
order a read goes: a request (FrameRequest), its frames fetched but not
decoded with what that cost (FetchedFrames), its frames decoded with what
the whole read cost (FrameRead), and the cache's running totals (CacheStats).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, get_args

import numpy as np
import torch

from episodes._decode import DecodeBackend
from episodes._mp4 import MiniMp4

Fetch = Literal["episode", "windows"]
"""What a read fetches: "episode", the episode's whole byte range (kept in the LRU for later reads); "windows",
only the samples the asked-for frames need, ranges coalesced across the requests of a batch (not kept)."""


@dataclass(frozen=True)
class CacheStats:
    """Totals since the cache opened. Times are seconds summed over threads.

    `windows` counts frame windows (one per distinct frame asked for with
    fetch="windows"), `window_runs` the runs they merge into, and
    `range_requests` the range reads actually made (for either mode, after
    coalescing). `bytes_planned` is what the windows (or episode ranges)
    span one by one, `bytes_fetched` what was read, `bytes_useful` the
    sample bytes decoding uses.

    The byte budget (episodes._budget): `bytes_held` is what the cache
    holds now, kept mini-MP4s (`cached_bytes`) and fetches not yet handed
    over, `peak_bytes_held` the most it ever held; `prefetches_skipped`
    counts fetches ahead that did not start because their bytes would not
    fit, `prefetches_dropped` those let go of to make room for a read.

    `index_sidecar_loads` counts MP4 indexes the sidecar gave, and
    `index_sidecar_stale` those it gave over HTTP, where a range read's
    answer checks the file, that the answer found changed: rebuilt from the
    file's headers (`index_builds`), the reads planned with them read again.
    """

    hits: int = 0
    misses: int = 0
    shared_fetches: int = 0
    evictions: int = 0
    cached_items: int = 0
    cached_bytes: int = 0
    index_builds: int = 0
    index_sidecar_loads: int = 0
    index_sidecar_stale: int = 0
    header_reads: int = 0
    header_bytes: int = 0
    bytes_fetched: int = 0
    bytes_reused: int = 0
    bytes_planned: int = 0
    bytes_useful: int = 0
    windows: int = 0
    window_runs: int = 0
    range_requests: int = 0
    frames_decoded: int = 0
    bytes_held: int = 0
    peak_bytes_held: int = 0
    prefetches_skipped: int = 0
    prefetches_dropped: int = 0
    lookup_s: float = 0.0
    fetch_s: float = 0.0
    synthesize_s: float = 0.0
    store_s: float = 0.0
    decode_s: float = 0.0


class Counts:
    """A cache's running totals, added to from any of its threads (the CacheStats fields that count and time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int | float] = asdict(CacheStats())

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def snapshot(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._counts)  # type: ignore[arg-type]  # the counts are CacheStats' own fields


@dataclass(frozen=True)
class FrameRequest:
    """Frames of one episode-camera: by `timestamps` or by `frame_numbers`, or, with neither, every frame.

    Timestamps are seconds from the episode's first frame, each mapped to
    the frame shown then (within half a frame); frame numbers count from 0
    within the episode. Frames come back in the order asked, repeats
    included.
    """

    episode: int
    key: str
    timestamps: Sequence[float] | np.ndarray | torch.Tensor | None = None
    frame_numbers: Sequence[int] | np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.timestamps is not None and self.frame_numbers is not None:
            raise TypeError("pass timestamps or frame_numbers, not both")


@dataclass(frozen=True)
class FetchedFrames:
    """A request's frames fetched but not yet decoded: the mini-MP4 they decode from, and what fetching cost.

    `frame_numbers` are the request's episode frames in the order asked;
    the mini-MP4 holds the whole episode (fetch="episode") or just the
    samples those frames need (fetch="windows"). Picklable, so a fetch
    process can hand it (or its `mini`) to a decode process.

    `bytes_fetched` is what this request caused to be read from storage
    (its own fetch, or a prefetch made before anyone used it);
    `bytes_reused` what it used that an earlier read had paid for. Times
    are those of the fetch that produced the bytes it paid for, 0 when it
    reused them. `fetched_ahead`: the bytes it paid for were fetched before
    it asked, by a prefetch (it may have waited for that fetch to end).
    """

    episode: int
    key: str
    frame_numbers: np.ndarray
    mini: MiniMp4
    cache_hit: bool
    bytes_fetched: int = 0
    bytes_reused: int = 0
    lookup_s: float = 0.0
    fetch_s: float = 0.0
    synthesize_s: float = 0.0
    fetched_ahead: bool = False


@dataclass(frozen=True)
class FrameRead:
    """A request's frames, uint8 (N, C, H, W), and what reading them cost (see FetchedFrames for the byte counts).

    `backend` says where they were decoded: on a CUDA device, NVDEC or torchcodec's silent CPU fallback.
    """

    frames: torch.Tensor
    cache_hit: bool
    bytes_fetched: int
    bytes_reused: int
    frames_decoded: int
    lookup_s: float
    fetch_s: float
    synthesize_s: float
    decode_s: float
    backend: DecodeBackend = DecodeBackend("cpu")


def checked_fetch(fetch: Fetch) -> Fetch:
    """`fetch` itself; a caller that bypassed the type checker with another string gets the error, not a default."""
    if fetch not in get_args(Fetch):
        raise ValueError(f"fetch must be one of {', '.join(get_args(Fetch))}, not {fetch!r}")
    return fetch


def half_frame(duration: np.ndarray, timescale: int) -> float:
    return 0.5 * float(np.median(duration)) / timescale


def frame_numbers_of(mini: MiniMp4, request: FrameRequest, length: int, where: str) -> np.ndarray:
    """The request's episode frame numbers, its timestamps mapped through a whole-episode mini-MP4's frame times."""
    return numbers_at(mini.frame_pts_seconds, half_frame(mini.duration, mini.timescale), request, length, where)


def numbers_at(frame_seconds: np.ndarray, half: float, request: FrameRequest, length: int, where: str) -> np.ndarray:
    """Frame numbers of the request: its frame_numbers checked against `length`, its timestamps mapped (frames_at),
    or, when it names neither, all `length` of them."""
    if request.timestamps is not None:
        return frames_at(frame_seconds, half, np.asarray(request.timestamps, dtype=np.float64), where=where)
    if request.frame_numbers is None:
        return np.arange(length, dtype=np.int64)
    numbers = np.asarray(request.frame_numbers, dtype=np.int64).reshape(-1)
    bad = numbers[(numbers < 0) | (numbers >= length)]
    if len(bad):
        raise IndexError(f"{where}: frame {int(bad[0])} is out of range (the episode has {length})")
    if len(numbers) == 0:
        raise ValueError(f"{where}: no frames were asked for")
    return numbers


def frames_at(frame_seconds: np.ndarray, half: float, timestamps: np.ndarray, *, where: str) -> np.ndarray:
    """Episode frame numbers shown at `timestamps` seconds after the episode's first frame.

    `frame_seconds` are the episode's frame times on the file's timeline
    and `half` half a frame's duration. Each instant maps to the nearest
    frame and must lie within half a frame of it: accumulated-float
    timestamps such as 0.30000000000000004 still find frame 9 at 30 fps,
    and no float is ever compared for equality.
    """
    relative = frame_seconds - frame_seconds[0]
    flat = timestamps.reshape(-1)
    right = np.clip(np.searchsorted(relative, flat), 1, max(len(relative) - 1, 1))
    left = right - 1
    nearest = np.where(np.abs(relative[np.minimum(right, len(relative) - 1)] - flat) < np.abs(relative[left] - flat),
                       np.minimum(right, len(relative) - 1), left)
    off = np.flatnonzero(~(np.abs(relative[nearest] - flat) <= half * (1 + 1e-9)))
    if len(off):
        t = float(flat[off[0]])
        raise ValueError(
            f"{where}: timestamp {t} s is not within half a frame of any of the episode's {len(relative)} frames"
            f" (0 to {relative[-1]:.6f} s)"
        )
    if len(flat) == 0:
        raise ValueError(f"{where}: no frames were asked for")
    return nearest.astype(np.int64)
