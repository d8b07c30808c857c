"""Clips built from the distinct decoded frames: resizing before the pick gives exactly what picking first gave."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from episodes import EpisodeByteCache, FrameRequest, open_dataset
from episodes.synthetic import make_dataset
from models.episode_decode import decode_clips, to_clips
from models.episode_reader import sample_clip_frames
from rnb.core.timecard import TimeCard

Decoded = tuple[torch.Tensor, np.ndarray]


def picked_first(frames: torch.Tensor, order: torch.Tensor, num_clips: int, size: int) -> torch.Tensor:
    """The loader's clips as they were made before: every clip frame gathered at full size, then resized."""
    return to_clips(frames[order], num_clips, size)


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Decoded:
    """Every frame of a short 48x64 H.264 episode as torchcodec hands them over, and its length."""
    root = make_dataset(tmp_path_factory.mktemp("clips") / "ds", episodes=2, cameras=1, episodes_per_file=2,
                        min_length=14, max_length=14, width=64, height=48, gop=6, bframes=2)
    ds = open_dataset(str(root))
    with EpisodeByteCache(ds) as cache:
        (read,) = cache.read_frames([FrameRequest(1, ds.video_keys[0])])
    return read.frames, np.arange(ds.episode_length(1))


@pytest.mark.parametrize("size", [16, 32, 112])  # down, down, and up
def test_resizing_the_distinct_frames_then_picking_equals_picking_then_resizing(decoded: Decoded, size: int) -> None:
    frames, _ = decoded
    rng = np.random.default_rng(size)
    order = torch.from_numpy(rng.integers(0, len(frames), size=3 * 5))  # repeats and any order
    ours = to_clips(frames, 3, size, order=order)
    assert ours.shape == (3, 3, 5, size, size)
    assert torch.equal(ours, picked_first(frames, order, 3, size))


def test_frame_layout_does_not_change_the_clips() -> None:
    """torchcodec hands NCHW views of NHWC memory; a contiguous copy of the same frames gives the same clips."""
    nhwc = torch.randint(0, 256, (7, 40, 56, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    view = nhwc.permute(0, 3, 1, 2)
    order = torch.tensor([6, 0, 0, 3, 2, 2, 5, 1])
    assert not view.is_contiguous()
    assert torch.equal(to_clips(view, 2, 24, order=order), picked_first(view.contiguous(), order, 2, 24))


def test_decode_clips_of_overlapping_clips_in_a_short_episode(decoded: Decoded) -> None:
    """Clips longer than the episode repeat its last frame; each frame is decoded once and picked again."""
    frames, numbers = decoded
    clip_frames = sample_clip_frames(len(numbers), 3, 20, np.random.default_rng(1))
    card = TimeCard(0)
    distinct = np.unique(clip_frames)
    clips = decode_clips(clip_frames, lambda: frames[torch.from_numpy(distinct)], 32, card)
    assert card.fields["frames_decoded"] == len(distinct) < clip_frames.size
    assert torch.equal(clips, to_clips(frames[torch.from_numpy(clip_frames.reshape(-1))], 3, 32))
