"""Episode spans: which frames an interval selects, where decoding must start, which bytes it needs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from episodes._errors import Mp4FormatError
from episodes._mp4.span import episode_span
from episodes._mp4.writer import synthesize_mini_mp4
from tests.support.mp4_fixtures import ALL_KINDS, FPS, FRAMES, clip_dir, make_mp4, read_index, top_level

__all__ = ["clip_dir"]


@pytest.mark.parametrize("kind", ["av1_gop2", "h264_bframes"])
def test_back_to_back_episodes_with_accumulated_float_bounds(clip_dir: Path, kind: str) -> None:
    index = read_index(make_mp4(clip_dir, kind))
    presentation_order = np.argsort(index.pts, kind="stable")
    bound, first, seen = 0.0, 0, []
    for length in (7, 13, 20, 32):
        end = bound
        for _ in range(length):
            end += 1 / FPS
        span = episode_span(index, bound, end, expected_frames=length)
        assert list(span.frames) == presentation_order[first : first + length].tolist()
        seen += span.frames
        bound, first = end, first + length
    assert sorted(seen) == list(range(FRAMES))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_span_starts_at_a_usable_sync_sample_and_ends_at_the_last_needed_sample(clip_dir: Path, kind: str) -> None:
    index = read_index(make_mp4(clip_dir, kind))
    origin = index.pts.min() / index.timescale
    for first, end in [(0, 5), (13, 40), (37, FRAMES), (FRAMES - 1, FRAMES)]:
        span = episode_span(index, origin + first / FPS, origin + end / FPS)
        frames = np.array(span.frames)
        shown_first = index.pts[frames].min()
        assert index.is_sync[span.sample_start] and index.pts[span.sample_start] <= shown_first
        later_syncs = np.flatnonzero(index.is_sync[span.sample_start + 1 : frames.min() + 1]) + span.sample_start + 1
        assert all(index.pts[s] > shown_first for s in later_syncs)
        assert span.sample_stop == frames.max() + 1
        run = slice(span.sample_start, span.sample_stop)
        assert span.byte_start == index.offset[run].min()
        assert span.byte_end == (index.offset[run] + index.size[run]).max()


def test_open_gop_leading_pictures_pull_the_start_back(clip_dir: Path) -> None:
    index = read_index(make_mp4(clip_dir, "hevc_bframes"))
    syncs = np.flatnonzero(index.is_sync)
    # A sync sample shown after some sample that follows it in decode order: x265's open GOP.
    cra = next(s for s in syncs[1:] if (index.pts[s + 1 : s + 4] < index.pts[s]).any())
    leading = cra + 1 + int(np.argmin(index.pts[cra + 1 : cra + 4]))
    shown = index.pts[leading] / index.timescale
    span = episode_span(index, shown, shown + 1 / FPS, expected_frames=1)
    assert span.frames == (leading,)
    assert span.sample_start < cra and index.is_sync[span.sample_start]


def test_interleaved_audio_bytes_are_left_out_of_the_mini_mp4(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "h264_with_audio")
    index = read_index(path)
    span = episode_span(index, 10 / FPS, 50 / FPS, expected_frames=40)
    run = slice(span.sample_start, span.sample_stop)
    video_bytes = int(index.size[run].sum())
    assert span.num_bytes > video_bytes  # audio chunks sit between the video chunks
    data = path.read_bytes()
    mini = synthesize_mini_mp4(index, span, data[span.byte_start : span.byte_end])
    [(_, _, payload_start, end)] = [box for box in top_level(mini.data) if box[0] == "mdat"]
    assert end - payload_start == video_bytes
    assert mini.data[payload_start : payload_start + 32] == data[index.offset[span.sample_start] :][:32]


def test_expected_frames_mismatch_and_empty_interval(clip_dir: Path) -> None:
    index = read_index(make_mp4(clip_dir, "av1_gop2"))
    with pytest.raises(Mp4FormatError, match=r"^av1_gop2\.mp4: \[0\.5, 1\.0\) s holds 15 frames, expected 16$"):
        episode_span(index, 0.5, 1.0, expected_frames=16)
    with pytest.raises(Mp4FormatError, match=r"^av1_gop2\.mp4: no frame is presented in \[5\.0, 6\.0\) s$"):
        episode_span(index, 5.0, 6.0)


def test_payload_of_the_wrong_length_is_refused(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "av1_gop2")
    index = read_index(path)
    span = episode_span(index, 0.0, 0.5)
    with pytest.raises(Mp4FormatError, match=rf"^av1_gop2\.mp4: payload for bytes \[{span.byte_start}, {span.byte_end}\)"):
        synthesize_mini_mp4(index, span, path.read_bytes()[span.byte_start : span.byte_end - 1])
