"""Check the byte-range path against the plain one: every episode's frames, both ways, compared bit for bit.

The reference decodes the whole source file with torchcodec in exact seek
mode and takes the frames at the episode's global positions, which come from
torchcodec's own scan of the file (its first timestamp) and the episode's
`from_timestamp`, so no part of our MP4 index is trusted by the reference.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike

import torch
from torchcodec.decoders import VideoDecoder

from episodes import EpisodeByteCache, EpisodeDataError, EpisodeDataset, FrameRequest


@dataclass(frozen=True)
class EpisodeCheck:
    """One episode-camera: identical or not, and if not, the first differing frame or the error."""

    episode: int
    key: str
    frames: int
    identical: bool
    detail: str = ""


@dataclass(frozen=True)
class VerifyReport:
    checks: tuple[EpisodeCheck, ...]

    @property
    def identical(self) -> int:
        return sum(c.identical for c in self.checks)

    @property
    def different(self) -> int:
        return len(self.checks) - self.identical


class FullFileReference:
    """torchcodec over whole source files, one open decoder at a time (files are visited in order)."""

    def __init__(self, ds: EpisodeDataset, device: str = "cpu") -> None:
        self.ds, self.device = ds, device
        self._path: str | None = None
        self._decoder: VideoDecoder | None = None
        self._file: io.IOBase | None = None   # what fsspec opened

    def _open(self, rel: str) -> VideoDecoder:
        if rel != self._path or self._decoder is None:
            self.close()
            storage = self.ds.storage
            file = storage.fs.open(storage.path(rel), "rb")
            self._file, self._decoder = file, VideoDecoder(file, seek_mode="exact", device=self.device)
            self._path = rel
        return self._decoder

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._path = self._decoder = self._file = None

    def global_indices(self, ep: int, key: str, frame_numbers: Sequence[int]) -> list[int]:
        """Positions in the source file, in presentation order, of the episode's frames."""
        segment = self.ds.episode(ep).videos[key]
        decoder = self._open(segment.path)
        begin = decoder.metadata.begin_stream_seconds or 0.0   # None is torchcodec's 0 (no scan)
        first = round((segment.from_timestamp - begin) * self._fps(decoder))
        return [first + int(n) for n in frame_numbers]

    def _fps(self, decoder: VideoDecoder) -> float:
        fps = self.ds.fps or decoder.metadata.average_fps
        if not fps:
            raise ValueError(f"{self.ds.root}: neither the dataset nor its video says the frame rate")
        return float(fps)

    def frames(self, ep: int, key: str, frame_numbers: Sequence[int]) -> torch.Tensor:
        indices = self.global_indices(ep, key, frame_numbers)
        return self._open(self.ds.episode(ep).videos[key].path).get_frames_at(indices).data


def verify_dataset(
    ds: EpisodeDataset,
    *,
    device: str = "cpu",
    cameras: Sequence[str] | None = None,
    cache_dir: str | PathLike[str] | None = None,
    on_check: Callable[[EpisodeCheck], None] | None = None,
) -> VerifyReport:
    """Decode every frame of every episode-camera both ways and compare; `on_check` sees each result.

    The byte-range side keeps its MP4 indexes under `cache_dir`, as any cache would.
    """
    keys = tuple(cameras) if cameras is not None else ds.video_keys
    unknown = [k for k in keys if k not in ds.video_keys]
    if unknown:
        raise ValueError(f"camera {unknown[0]!r} is not in the dataset (it has {', '.join(ds.video_keys)})")
    reference = FullFileReference(ds, device)
    checks = []
    try:
        with EpisodeByteCache(ds, byte_budget=256 * 2**20, workers=2, cache_dir=cache_dir) as cache:
            for key in keys:
                for ep in sorted(range(ds.num_episodes), key=lambda e: ds.episode(e).videos[key].path):
                    check = _check_one(ds, cache, reference, ep, key, device)
                    checks.append(check)
                    if on_check:
                        on_check(check)
    finally:
        reference.close()
    return VerifyReport(tuple(checks))


def _check_one(ds: EpisodeDataset, cache: EpisodeByteCache, reference: FullFileReference, ep: int, key: str,
               device: str) -> EpisodeCheck:
    numbers = list(range(ds.episode_length(ep)))
    try:
        ours = cache.read_frames([FrameRequest(ep, key)], device=device)[0].frames
    except EpisodeDataError as exc:
        return EpisodeCheck(ep, key, len(numbers), False, f"byte-range path failed: {exc}")
    try:
        theirs = reference.frames(ep, key, numbers)
    except (RuntimeError, IndexError, ValueError, OSError) as exc:
        return EpisodeCheck(ep, key, len(numbers), False, f"full-file decode failed: {exc}")
    if ours.shape != theirs.shape:
        return EpisodeCheck(ep, key, len(numbers), False, f"shape {tuple(ours.shape)} != {tuple(theirs.shape)}")
    differing = (ours != theirs).flatten(1).any(dim=1).nonzero().flatten()
    if len(differing):
        return EpisodeCheck(ep, key, len(numbers), False,
                            f"{len(differing)} frames differ, first at episode frame {int(differing[0])}")
    return EpisodeCheck(ep, key, len(numbers), True)
