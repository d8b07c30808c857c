"""Small test MP4s made with the ffmpeg CLI from lavfi testsrc2, byte-level surgery helpers, and the references
frames are checked against (torchcodec's decode of the whole file, the synthetic frames' drawn index).

Every clip is 128x96 at 30 fps with a fixed GOP, so frame i is shown at i/30 s
(plus the clip's offset) and spans can be chosen by frame number.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from torchcodec.decoders import VideoDecoder

from episodes._mp4.index import Mp4Index, build_index
from episodes.synthetic import BITS

FPS = 30
FRAMES = 72
_SOURCE = ["-f", "lavfi", "-i", f"testsrc2=size=128x96:rate={FPS}:duration={FRAMES / FPS}"]
_X264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-x264-params", "keyint=12:min-keyint=12:scenecut=0"]

# name -> ffmpeg arguments after the inputs; each exercises one layout or codec.
KINDS: dict[str, list[str]] = {
    # B-frames (ctts) and the edit list FFmpeg writes for them; moov after mdat.
    "h264_bframes": [*_X264, "-bf", "3"],
    # moov before mdat, no B-frames.
    "h264_faststart": [*_X264, "-bf", "0", "-movflags", "+faststart"],
    # ctts version 1 with negative offsets instead of an edit list.
    "h264_negative_cts": [*_X264, "-bf", "2", "-movflags", "+negative_cts_offsets"],
    # Every sample a keyframe: FFmpeg then writes no stss.
    "h264_intra": ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", "1", "-bf", "0"],
    # A leading empty edit: presentation starts at 0.5 s.
    "h264_offset": [*_X264, "-bf", "2", "-output_ts_offset", "0.5"],
    # HEVC with B-frames and x265's default open GOPs (CRA + leading pictures).
    "hevc_bframes": ["-c:v", "libx265", "-pix_fmt", "yuv420p", "-tag:v", "hvc1",
                     "-x265-params", "keyint=12:min-keyint=12:bframes=3:scenecut=0:log-level=error"],
    # What LeRobot records by default: SVT-AV1 with a keyframe every 2 frames.
    "av1_gop2": ["-c:v", "libsvtav1", "-pix_fmt", "yuv420p", "-g", "2", "-preset", "12"],
}

# An audio track listed first and interleaved with the video chunks.
_WITH_AUDIO = ["-f", "lavfi", "-i", f"sine=frequency=440:duration={FRAMES / FPS}"]
KINDS_WITH_AUDIO = {"h264_with_audio": [*_X264, "-bf", "2", "-c:a", "aac", "-map", "1:a", "-map", "0:v"]}


ALL_KINDS = [*KINDS, *KINDS_WITH_AUDIO]


def make_mp4(directory: Path, kind: str) -> Path:
    """Encode the clip `kind` into `directory` (once) and return its path."""
    path = directory / f"{kind}.mp4"
    if path.exists():
        return path
    if shutil.which("ffmpeg") is None:  # the lent GPU machines have FFmpeg's libraries (carried), not its command
        pytest.skip("needs the ffmpeg command to encode its clips")
    if kind in KINDS:
        inputs, args = _SOURCE, KINDS[kind]
    else:
        inputs, args = [*_SOURCE, *_WITH_AUDIO], KINDS_WITH_AUDIO[kind]
    subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-y", *inputs, *args, str(path)],
        check=True, capture_output=True, env={**os.environ, "SVT_LOG": "1"},
    )
    return path


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per test session, so every test file reuses the same encoded clips."""
    path = tmp_path_factory.getbasetemp() / "mp4_clips"
    path.mkdir(exist_ok=True)
    return path


def read_index(path: Path, reads: list[tuple[int, int]] | None = None) -> Mp4Index:
    """build_index over a local file's bytes, recording each range read into `reads`."""
    data = path.read_bytes()

    def read_range(start: int, end: int) -> bytes:
        if reads is not None:
            reads.append((start, end))
        return data[start:end]

    return build_index(read_range, len(data), name=path.name)


def top_level(data: bytes) -> list[tuple[str, int, int, int]]:
    """(type, start, payload_start, end) of each top-level box, walked independently of the code under test."""
    boxes, pos = [], 0
    while pos < len(data):
        size, box_type = struct.unpack_from(">I4s", data, pos)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, pos + 8)
            header = 16
        elif size == 0:
            size = len(data) - pos
        boxes.append((box_type.decode(), pos, pos + header, pos + size))
        pos += size
    return boxes


def box_path(data: bytes, path: list[str], start: int = 0, end: int | None = None) -> list[int]:
    """Start offsets of the boxes along `path` (e.g. ["moov", "trak", "mdia"]), first match at each level."""
    end = len(data) if end is None else end
    found, pos = [], start
    for name in path:
        while pos < end:
            size, box_type = struct.unpack_from(">I4s", data, pos)
            if box_type.decode() == name:
                found.append(pos)
                end, pos = pos + size, pos + 8
                break
            pos += size
        else:
            raise KeyError(f"no {name} box along {path}")
    return found


def replace_box(data: bytes, path: list[str], new_box: bytes) -> bytes:
    """`data` with the last box of `path` replaced by `new_box`, ancestors' sizes fixed.

    Only valid where no sample offset moves, i.e. the moov lies after mdat.
    """
    starts = box_path(data, path)
    target = starts[-1]
    old_size = struct.unpack_from(">I", data, target)[0]
    delta = len(new_box) - old_size
    out = bytearray(data[:target] + new_box + data[target + old_size :])
    for ancestor in starts[:-1]:
        struct.pack_into(">I", out, ancestor, struct.unpack_from(">I", out, ancestor)[0] + delta)
    return bytes(out)


VIDEO_STBL = ["moov", "trak", "mdia", "minf", "stbl"]


def read_indices(frames: torch.Tensor) -> list[int]:
    """Decode the frame number drawn as a 4x4 grid of bright/dark blocks."""
    n, _, h, w = frames.shape
    centres = frames[:, :, (np.arange(4) * 2 + 1) * h // 8][:, :, :, (np.arange(4) * 2 + 1) * w // 8]
    bits = (centres.max(dim=1).values > 100).reshape(n, BITS).long()
    return (bits << torch.arange(BITS)).sum(dim=1).tolist()


@cache
def full_decoder(path: Path, device: str = "cpu") -> VideoDecoder:
    """torchcodec's decoder of the whole file: the reference that frames decoded from a mini-MP4 must equal."""
    return VideoDecoder(str(path), seek_mode="exact", device=device)
