"""Decoding a mini-MP4 with torchcodec: the cache's decode phase, and the whole of it in a process without a cache.

The decoder is handed the frame table our index already knows
(`custom_frame_mappings`), so it seeks exactly without scanning the bytes;
frames come out bit-identical to torchcodec's decode of the source file.

On a CUDA device torchcodec decodes on NVDEC, unless it cannot: then it
decodes on the CPU and uploads the frames, without a word (no libnvcuvid
in the container, a codec or profile NVDEC lacks, frames under NVDEC's
minimum size, such as HEVC under 144x144).  `decode_backend` says which
happened, from what torchcodec reports of each decoder (`cpu_fallback`).

torchcodec is imported when a decoder is first opened, not with this
module: importing it costs 2 CPU-s here (it imports torch._dynamo), which
a job's main process, opening a dataset only to check it, would pay for
nothing (its children have it from their fork server).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import torch

from episodes._mp4.writer import MiniMp4

if TYPE_CHECKING:
    from torchcodec.decoders import VideoDecoder

DecodeDevice = Literal["cpu", "nvdec", "cpu-fallback"]
"""Where frames were decoded: "cpu" (FFmpeg on the CPU, as asked), "nvdec" (the GPU's video decoder), or
"cpu-fallback" (a CUDA device was asked for and torchcodec decoded on the CPU instead, then uploaded the frames)."""


@dataclass(frozen=True)
class DecodeBackend:
    """Where a decoder decodes, and torchcodec's own account of it."""

    device: DecodeDevice
    detail: str = ""
    """torchcodec's status line on a CUDA device (e.g. "[CUDA] Fallback status: Falling back due to: NVcuvid
    unavailable"); empty on the CPU."""


class _FallbackStatus(Protocol):
    """What torchcodec's CpuFallbackStatus offers: true when the decoder fell back, and a sentence."""

    status_known: bool

    def __bool__(self) -> bool: ...


class _ReportsFallback(Protocol):
    @property
    def cpu_fallback(self) -> _FallbackStatus: ...


def decode_backend(decoder: _ReportsFallback, device: str | torch.device) -> DecodeBackend:
    """Where `decoder`, opened on `device`, decodes: ask it once it has decoded (torchcodec 0.15's `cpu_fallback`).

    torchcodec's NVDEC backend knows at once, its FFmpeg CUDA backend after
    the first frame; a status still unknown counts as a fallback, so that
    nothing is called NVDEC that was not seen to be.
    """
    if torch.device(device).type != "cuda":
        return DecodeBackend("cpu")
    status = decoder.cpu_fallback
    if status.status_known and not status:
        return DecodeBackend("nvdec", str(status))
    return DecodeBackend("cpu-fallback", str(status))


def frame_mappings(mini: MiniMp4) -> str:
    """The mini-MP4's frames as the JSON torchcodec accepts for `custom_frame_mappings`."""
    frames = [
        {"pts": pts, "duration": duration, "key_frame": int(key)}
        for pts, duration, key in zip(mini.pts.tolist(), mini.duration.tolist(), mini.is_key.tolist())
    ]
    return json.dumps({"frames": frames})


def open_decoder(mini: MiniMp4, device: str | torch.device = "cpu", *, num_threads: int = 1) -> VideoDecoder:
    """A torchcodec decoder over the mini-MP4, worth keeping when several reads hit one episode.

    A CUDA device decodes on NVDEC; `num_threads` only affects CPU decoding.
    """
    from torchcodec.decoders import VideoDecoder

    return VideoDecoder(
        mini.data,
        device=str(device),
        num_ffmpeg_threads=num_threads,
        custom_frame_mappings=frame_mappings(mini),
    )


def decode_mini_mp4(
    mini: MiniMp4,
    frame_numbers: Sequence[int] | np.ndarray,
    device: str | torch.device = "cpu",
    *,
    decoder: VideoDecoder | None = None,
) -> torch.Tensor:
    """Episode frames `frame_numbers` (0-based within the episode) as a uint8 (N, C, H, W) tensor.

    A frame the mini-MP4 does not hold (out of the episode, or outside a
    frame-window mini-MP4's frames) is an IndexError. Pass `decoder` (from
    open_decoder for this mini-MP4) to reuse one; else a fresh one is
    opened on `device`.
    """
    positions = mini.mini_frames(np.asarray(frame_numbers, dtype=np.int64))
    if decoder is None:
        decoder = open_decoder(mini, device)
    return decoder.get_frames_at(positions.tolist()).data
