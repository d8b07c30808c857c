"""Decoding a mini-MP4 with torchcodec: the cache's decode phase, and the whole of it in a process without a cache.

The decoder is handed the frame table our index already knows
(`custom_frame_mappings`), so it seeks exactly without scanning the bytes;
frames come out bit-identical to torchcodec's decode of the source file.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from episodes._mp4.writer import MiniMp4


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
