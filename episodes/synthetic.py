"""Synthetic LeRobot v3.0 datasets: RnB's default dataset, and the data of tests and benchmarks.

A public module of the library (not of its test kit), since a pipeline
writes its missing default dataset with it in production
(rnb.pipeline.dataset_source, scripts/make_dataset.py).

The layout mimics a long robot recording: each MP4 holds several episodes
encoded in one go, so GOPs cross episode boundaries, and the episode
timestamps are accumulated floats restarting at 0 in each file. Every frame
shows its dataset-wide index as large binary blocks (which survive lossy
coding) in a camera-specific colour, so any two decoded frames differ.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torchcodec.encoders import VideoEncoder

from episodes._layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODE_COLUMNS,
    EPISODES_PATH,
    INFO_PATH,
    ROW_INDEX,
    TASKS_PATH,
    VIDEO_FIELDS,
    VIDEO_PATH,
    video_column,
)

CODECS = ("h264", "hevc", "av1")
BITS = 16  # a 4x4 grid of blocks: up to 65536 distinct frames per dataset
STATE_DIM = 6


@dataclass(frozen=True)
class SyntheticSpec:
    """Everything that determines a generated dataset (the same spec gives the same bytes)."""

    episodes: int = 24
    cameras: int = 2
    episodes_per_file: int = 8
    files_per_chunk: int = 1000
    min_length: int = 30
    max_length: int = 90
    fps: int = 30
    width: int = 128
    height: int = 128
    codec: str = "h264"
    gop: int = 30
    bframes: int = 2
    crf: int = 23
    faststart: bool = False
    row_group_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        positive = ("episodes", "cameras", "episodes_per_file", "files_per_chunk", "min_length",
                    "fps", "width", "height", "gop", "row_group_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_length < self.min_length:
            raise ValueError(f"max_length ({self.max_length}) is below min_length ({self.min_length})")
        if self.bframes < 0:
            raise ValueError(f"bframes must be >= 0, got {self.bframes}")
        if self.width % 8 or self.height % 8 or self.width < 32 or self.height < 32:
            raise ValueError(f"width and height must be multiples of 8 and at least 32, got {self.width}x{self.height}")
        if self.episodes * self.max_length > 2**BITS:
            raise ValueError(f"at most {2**BITS} frames fit the frame-number pattern")


def camera_keys(cameras: int) -> list[str]:
    return [f"observation.images.cam{c}" for c in range(cameras)]


def draw_frames(first_index: int, count: int, camera: int, height: int, width: int) -> torch.Tensor:
    """Frames (count, 3, H, W) showing global indices first_index.. as 4x4 blocks of bits."""
    indices = torch.arange(first_index, first_index + count)
    bits = (indices[:, None] >> torch.arange(BITS)[None, :]) & 1  # (count, 16)
    grid = bits.reshape(count, 4, 4).to(torch.uint8)
    ys = torch.arange(height) * 4 // height
    xs = torch.arange(width) * 4 // width
    mask = grid[:, ys][:, :, xs]  # (count, H, W), 1 where a bit is set
    hue = torch.tensor([[230, 40, 40], [40, 200, 60], [50, 80, 230], [220, 200, 40]][camera % 4], dtype=torch.uint8)
    frames = torch.full((count, 3, height, width), 16, dtype=torch.uint8)
    return torch.where(mask[:, None].bool(), hue[None, :, None, None], frames)


class _EncoderOptions(TypedDict):
    """The keywords of torchcodec's VideoEncoder.to_file that a codec sets."""

    codec: str
    crf: int
    preset: str | int
    extra_options: dict[str, str]


def _encoder_options(spec: SyntheticSpec) -> _EncoderOptions:
    if spec.codec == "h264":
        return _EncoderOptions(codec="libx264", crf=spec.crf, preset="veryfast",
                               extra_options={"g": str(spec.gop), "bf": str(spec.bframes)})
    if spec.codec == "hevc":
        params = f"keyint={spec.gop}:min-keyint={spec.gop}:bframes={spec.bframes}:log-level=error"
        return _EncoderOptions(codec="libx265", crf=spec.crf, preset="veryfast", extra_options={"x265-params": params})
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner to stderr unless told errors only
    return _EncoderOptions(codec="libsvtav1", crf=spec.crf + 10, preset=10, extra_options={"g": str(spec.gop)})


def encode_video(frames: torch.Tensor, path: Path, spec: SyntheticSpec) -> None:
    """Write uint8 (N, 3, H, W) frames as one MP4 with the spec's codec, GOP, B-frames and faststart.

    Public so that other generators (the benchmarks' grainy datasets) encode
    exactly the way make_dataset does.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    VideoEncoder(frames, frame_rate=spec.fps).to_file(path, pixel_format="yuv420p", **_encoder_options(spec))
    if spec.faststart:
        moved = path.with_suffix(".faststart.mp4")
        subprocess.run(
            ["ffmpeg", "-v", "error", "-y", "-i", str(path), "-c", "copy", "-movflags", "+faststart", str(moved)],
            check=True,
        )
        os.replace(moved, path)


def _fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), pa.float32()), values.shape[1])


def _features(spec: SyntheticSpec) -> dict[str, dict[str, object]]:
    features: dict[str, dict[str, object]] = {}
    for key in camera_keys(spec.cameras):
        features[key] = {
            "dtype": "video",
            "shape": [spec.height, spec.width, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.fps": spec.fps, "video.codec": spec.codec, "video.pix_fmt": "yuv420p"},
        }
    for key in ("observation.state", "action"):
        features[key] = {"dtype": "float32", "shape": [STATE_DIM], "names": [f"joint{j}" for j in range(STATE_DIM)]}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def make_dataset(out_dir: str | os.PathLike[str], spec: SyntheticSpec | None = None, **options: Any) -> Path:
    """Write a dataset under `out_dir` (replacing what is there) and return its root.

    Pass either a SyntheticSpec or its fields as keywords (which SyntheticSpec's constructor checks).
    """
    if spec is None:
        spec = SyntheticSpec(**options)
    elif options:
        raise TypeError("pass either spec or keyword options, not both")
    root = Path(out_dir)
    if root.exists():
        shutil.rmtree(root)
    rng = np.random.default_rng(spec.seed)
    lengths = rng.integers(spec.min_length, spec.max_length + 1, size=spec.episodes)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for file_number, first in enumerate(range(0, spec.episodes, spec.episodes_per_file)):
        chunk, file_index = divmod(file_number, spec.files_per_chunk)
        group = _FileGroup(chunk, file_index, range(first, min(first + spec.episodes_per_file, spec.episodes)))
        _write_videos(root, spec, group, starts)
        _write_data(root, spec, group, lengths, starts, rng)
        _write_episodes(root, spec, group, lengths, starts)
    _write_info(root, spec, int(starts[-1]))
    return root


@dataclass(frozen=True)
class _FileGroup:
    """The episodes that share one video file per camera and one data file."""

    chunk: int
    file_index: int
    episodes: range

    def rel(self, template: str, **values: str) -> str:
        return template.format(chunk_index=self.chunk, file_index=self.file_index, **values)


def _write_videos(root: Path, spec: SyntheticSpec, group: _FileGroup, starts: np.ndarray) -> None:
    """One MP4 per camera holding the group's episodes back to back, encoded in one go."""
    lo, hi = int(starts[group.episodes[0]]), int(starts[group.episodes[-1] + 1])
    for camera, key in enumerate(camera_keys(spec.cameras)):
        frames = draw_frames(lo, hi - lo, camera, spec.height, spec.width)
        encode_video(frames, root / group.rel(VIDEO_PATH, video_key=key), spec)


def _write_data(root: Path, spec: SyntheticSpec, group: _FileGroup, lengths: np.ndarray, starts: np.ndarray,
                rng: np.random.Generator) -> None:
    """The data Parquet: one row per frame, random state and action, in row groups of spec.row_group_size."""
    eps = group.episodes
    lo, hi = int(starts[eps[0]]), int(starts[eps[-1] + 1])
    frame_index = np.concatenate([np.arange(lengths[e]) for e in eps])
    state = rng.standard_normal((hi - lo, STATE_DIM)).astype(np.float32)
    action = rng.standard_normal((hi - lo, STATE_DIM)).astype(np.float32)
    data = pa.table({
        "observation.state": _fixed_list(state),
        "action": _fixed_list(action),
        "timestamp": pa.array((frame_index / spec.fps).astype(np.float32)),
        "frame_index": pa.array(frame_index, pa.int64()),
        "episode_index": pa.array(np.concatenate([np.full(lengths[e], e) for e in eps]), pa.int64()),
        ROW_INDEX: pa.array(np.arange(lo, hi), pa.int64()),
        "task_index": pa.array(np.zeros(hi - lo, np.int64)),
    })
    path = root / group.rel(DATA_PATH)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, path, row_group_size=spec.row_group_size)


def _write_episodes(root: Path, spec: SyntheticSpec, group: _FileGroup, lengths: np.ndarray,
                    starts: np.ndarray) -> None:
    """The group's rows of the episodes table, with from_timestamp accumulated as LeRobot does."""
    keys = camera_keys(spec.cameras)
    rows: dict[str, list[int | float]] = {name: [] for name in EPISODE_COLUMNS}
    rows.update({video_column(key, field): [] for key in keys for field in VIDEO_FIELDS})
    clock = 0.0  # accumulated the way LeRobot appends episode durations
    for e in group.episodes:
        end = clock + float(lengths[e]) / spec.fps
        values: dict[str, int | float] = {"episode_index": e, "length": int(lengths[e]), "data/chunk_index": group.chunk,
                  "data/file_index": group.file_index, "dataset_from_index": int(starts[e]),
                  "dataset_to_index": int(starts[e + 1])}
        for key in keys:
            values.update({video_column(key, "chunk_index"): group.chunk,
                           video_column(key, "file_index"): group.file_index,
                           video_column(key, "from_timestamp"): clock, video_column(key, "to_timestamp"): end})
        for name, value in values.items():
            rows[name].append(value)
        clock = end
    path = root / group.rel(EPISODES_PATH)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), path)


def _write_info(root: Path, spec: SyntheticSpec, total_frames: int) -> None:
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": "synthetic",
        "total_episodes": spec.episodes,
        "total_frames": total_frames,
        "total_tasks": 1,
        "chunks_size": spec.files_per_chunk,
        "fps": spec.fps,
        "splits": {"train": f"0:{spec.episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if spec.cameras else None,
        "features": _features(spec),
    }
    (root / INFO_PATH).write_text(json.dumps(info, indent=2))
    pq.write_table(pa.table({"task_index": [0], "task": ["synthetic motion"]}), root / TASKS_PATH)
