"""Frames decoded from mini-MP4s are bit-identical to torchcodec's decode of the full file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchcodec.decoders import VideoDecoder

from episodes._decode import decode_backend, decode_mini_mp4, open_decoder
from episodes._mp4.index import Mp4Index
from episodes._mp4.span import episode_span
from episodes._mp4.writer import MiniMp4, synthesize_mini_mp4
from tests.support.mp4_fixtures import ALL_KINDS, FPS, FRAMES, clip_dir, full_decoder, make_mp4, read_index

__all__ = ["clip_dir"]

# (first frame, end frame): first frames, mid-GOP starts crossing GOPs, the end of the file, single frames.
SPANS = [(0, 10), (5, 23), (13, FRAMES), (FRAMES - 1, FRAMES), (30, 31), (0, FRAMES)]


def _mini(path: Path, index: Mp4Index, first: int, end: int) -> MiniMp4:
    start = index.pts.min() / index.timescale
    span = episode_span(index, start + first / FPS, start + end / FPS, expected_frames=end - first)
    data = path.read_bytes()
    return synthesize_mini_mp4(index, span, data[span.byte_start : span.byte_end])


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_mini_mp4_frames_are_bit_identical(clip_dir: Path, kind: str) -> None:
    path = make_mp4(clip_dir, kind)
    index = read_index(path)
    for first, end in SPANS:
        mini = _mini(path, index, first, end)
        reference = full_decoder(path).get_frames_at(list(range(first, end)))
        frames = decode_mini_mp4(mini, range(end - first))
        assert frames.dtype == torch.uint8 and frames.shape == (end - first, 3, 96, 128)
        assert torch.equal(frames, reference.data), (kind, first, end)
        ticks = np.round(reference.pts_seconds.numpy() * index.timescale).astype(np.int64)
        np.testing.assert_array_equal(mini.pts[mini.frame_index], ticks)
        np.testing.assert_allclose(mini.frame_pts_seconds, reference.pts_seconds.numpy(), rtol=0, atol=1e-12)


def test_mini_mp4_is_smaller_than_the_source_and_self_consistent(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "h264_bframes")
    mini = _mini(path, read_index(path), 25, 40)
    assert len(mini.data) < path.stat().st_size / 2
    # torchcodec's own exact scan of the mini-MP4 agrees with the frame table we hand it.
    scanned = VideoDecoder(mini.data, seek_mode="exact")
    assert scanned.metadata.num_frames == len(mini.pts)
    assert torch.equal(scanned.get_frames_at(mini.frame_index.tolist()).data, decode_mini_mp4(mini, range(15)))


def test_open_decoder_is_reusable_and_order_is_kept(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "hevc_bframes")
    mini = _mini(path, read_index(path), 13, 50)
    decoder = open_decoder(mini)
    picks = [36, 0, 17, 17, 5]
    first = decode_mini_mp4(mini, picks, decoder=decoder)
    again = decode_mini_mp4(mini, [0, 36], decoder=decoder)
    reference = full_decoder(path).get_frames_at([13 + p for p in picks]).data
    assert torch.equal(first, reference)
    assert torch.equal(again, reference[[1, 0]])


@pytest.mark.parametrize("bad", [-1, 37])
def test_out_of_range_frame_number(clip_dir: Path, bad: int) -> None:
    path = make_mp4(clip_dir, "av1_gop2")
    mini = _mini(path, read_index(path), 13, 50)
    with pytest.raises(IndexError, match=rf"^episode frame {bad} is out of range: the episode has 37 frames$"):
        decode_mini_mp4(mini, [0, bad])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["h264_bframes", "hevc_bframes", "av1_gop2"])
def test_nvdec_frames_equal_nvdec_full_file(clip_dir: Path, kind: str) -> None:
    """On the GPU too a mini-MP4's frames are the full file's; 128x96 HEVC is under NVDEC's 144x144 minimum."""
    path = make_mp4(clip_dir, kind)
    index = read_index(path)
    decoder = open_decoder(_mini(path, index, *SPANS[0]), "cuda:0")
    decoder.get_frames_at([0])
    expected = {"h264_bframes": "nvdec", "hevc_bframes": "cpu-fallback"}.get(kind)
    assert expected is None or decode_backend(decoder, "cuda:0").device == expected
    for first, end in SPANS:
        mini = _mini(path, index, first, end)
        frames = decode_mini_mp4(mini, range(end - first), device="cuda:0")
        assert frames.device.type == "cuda"
        reference = full_decoder(path, "cuda:0").get_frames_at(list(range(first, end))).data
        assert torch.equal(frames, reference), (kind, first, end)
