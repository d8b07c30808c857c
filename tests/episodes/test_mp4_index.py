"""Mp4Index against torchcodec's own view of the same files, and against damaged files."""
from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from torchcodec.decoders import VideoDecoder

from episodes._errors import Mp4FormatError
from episodes._mp4 import sample_table
from episodes._mp4.index import Mp4Index, build_index
from episodes._mp4.span import episode_span
from episodes._mp4.writer import synthesize_mini_mp4
from tests.support.mp4_fixtures import (
    ALL_KINDS,
    FRAMES,
    VIDEO_STBL,
    box_path,
    clip_dir,
    make_mp4,
    read_index,
    replace_box,
    top_level,
)

__all__ = ["clip_dir"]


def _same(a: Mp4Index, b: Mp4Index) -> None:
    for key, value in a.to_arrays().items():
        np.testing.assert_array_equal(value, b.to_arrays()[key], err_msg=key)


def _index_bytes(data: bytes, name: str = "clip.mp4") -> Mp4Index:
    return build_index(lambda start, end: data[start:end], len(data), name=name)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_pts_equal_torchcodec_and_mdat_is_never_read(clip_dir: Path, kind: str) -> None:
    path = make_mp4(clip_dir, kind)
    reads: list[tuple[int, int]] = []
    index = read_index(path, reads)
    decoder = VideoDecoder(str(path), seek_mode="exact")
    count = decoder.metadata.num_frames
    pts_seconds = decoder.get_frames_at(list(range(count))).pts_seconds.numpy()

    assert index.num_samples == count == FRAMES
    np.testing.assert_array_equal(np.sort(index.pts), np.round(pts_seconds * index.timescale).astype(np.int64))
    assert (index.width, index.height) == (128, 96)
    [(_, _, mdat_payload, mdat_end)] = [box for box in top_level(path.read_bytes()) if box[0] == "mdat"]
    assert reads and all(end <= mdat_payload or start >= mdat_end for start, end in reads)


@pytest.mark.parametrize("kind, order", [("h264_faststart", ["moov", "mdat"]), ("h264_bframes", ["mdat", "moov"])])
def test_moov_before_and_after_mdat(clip_dir: Path, kind: str, order: list[str]) -> None:
    boxes = [box[0] for box in top_level(make_mp4(clip_dir, kind).read_bytes()) if box[0] in order]
    assert boxes == order


def test_codecs_and_sync_samples(clip_dir: Path) -> None:
    expected = {"h264_bframes": "avc1", "hevc_bframes": "hvc1", "av1_gop2": "av01"}
    for kind, codec in expected.items():
        assert read_index(make_mp4(clip_dir, kind)).codec == codec
    assert np.flatnonzero(read_index(make_mp4(clip_dir, "h264_bframes")).is_sync).tolist() == list(range(0, FRAMES, 12))
    assert np.flatnonzero(read_index(make_mp4(clip_dir, "av1_gop2")).is_sync).tolist() == list(range(0, FRAMES, 2))


def test_no_stss_means_every_sample_is_sync(clip_dir: Path) -> None:
    path = make_mp4(clip_dir, "h264_intra")
    with pytest.raises(KeyError):
        box_path(path.read_bytes(), [*VIDEO_STBL, "stss"])
    assert read_index(path).is_sync.all()


def test_negative_ctts_is_version_1(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "h264_negative_cts").read_bytes()
    ctts = box_path(data, [*VIDEO_STBL, "ctts"])[-1]
    assert data[ctts + 8] == 1
    assert (sample_table.parse_ctts(data[ctts + 8 : ctts + struct.unpack_from(">I", data, ctts)[0]], "x") < 0).any()


def test_leading_empty_edit_delays_presentation(clip_dir: Path) -> None:
    index = read_index(make_mp4(clip_dir, "h264_offset"))
    assert index.pts.min() == index.timescale // 2


def test_first_video_track_is_chosen_behind_an_audio_track(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "h264_with_audio").read_bytes()
    first_trak = box_path(data, ["moov", "trak", "mdia", "hdlr"])[-1]
    assert data[first_trak + 16 : first_trak + 20] == b"soun"
    index = _index_bytes(data)
    assert index.codec == "avc1" and index.num_samples == FRAMES


def test_stz2_gives_the_same_index(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "h264_bframes").read_bytes()
    reference = _index_bytes(data)
    assert reference.size.max() < 2**16
    stz2 = struct.pack(">I4sI3xBI", 20 + 2 * FRAMES, b"stz2", 0, 16, FRAMES) + reference.size.astype(">u2").tobytes()
    converted = replace_box(data, [*VIDEO_STBL, "stsz"], stz2)
    _same(_index_bytes(converted), reference)


@pytest.mark.parametrize("field_size, packed", [(4, bytes([0x3F, 0x10])), (8, bytes([3, 15, 1]))])
def test_stz2_small_fields(field_size: int, packed: bytes) -> None:
    payload = struct.pack(">I3xBI", 0, field_size, 3) + packed
    assert sample_table.parse_stz2(payload, "x").tolist() == [3, 15, 1]


def test_co64_written_by_our_writer_indexes_the_same(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "hevc_bframes").read_bytes()
    source = _index_bytes(data)
    span = episode_span(source, 0.0, FRAMES / 30, expected_frames=FRAMES)
    mini = synthesize_mini_mp4(source, span, data[span.byte_start : span.byte_end], chunk_offset_box="co64")
    box_path(mini.data, [*VIDEO_STBL, "co64"])
    rebuilt = _index_bytes(mini.data)
    for key in ("pts", "duration", "size", "is_sync"):
        np.testing.assert_array_equal(getattr(rebuilt, key), getattr(source, key), err_msg=key)
    assert rebuilt.stsd == source.stsd


def test_64bit_mdat_size_and_size_zero(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "h264_bframes").read_bytes()
    reference = _index_bytes(data)
    free, mdat = [box for box in top_level(data) if box[0] in ("free", "mdat")]
    assert free[3] == mdat[1] and free[3] - free[1] == 8
    large = struct.pack(">I4sQ", 1, b"mdat", mdat[3] - free[1])
    widened = data[: free[1]] + large + data[mdat[2] :]
    assert [box[0] for box in top_level(widened)] == ["ftyp", "mdat", "moov"]
    _same(_index_bytes(widened), reference)

    faststart = make_mp4(clip_dir, "h264_faststart").read_bytes()
    last = top_level(faststart)[-1]
    assert last[0] == "mdat"
    to_end = faststart[: last[1]] + struct.pack(">I", 0) + faststart[last[1] + 4 :]
    _same(_index_bytes(to_end), _index_bytes(faststart))


def test_sidecar_arrays_round_trip_through_npz(clip_dir: Path) -> None:
    index = read_index(make_mp4(clip_dir, "av1_gop2"))
    buffer = io.BytesIO()
    np.savez(buffer, **index.to_arrays())
    buffer.seek(0)
    with np.load(buffer) as stored:
        restored = Mp4Index.from_arrays(dict(stored), name=index.name)
    _same(restored, index)
    assert (restored.codec, restored.timescale, restored.stsd) == (index.codec, index.timescale, index.stsd)
    with pytest.raises(Mp4FormatError, match=r"^clip\.mp4: stored MP4 index lacks pts, stsd$"):
        Mp4Index.from_arrays({k: v for k, v in index.to_arrays().items() if k not in ("pts", "stsd")}, name="clip.mp4")


def _inflate_stsz_count(data: bytes) -> bytes:
    stsz = box_path(data, [*VIDEO_STBL, "stsz"])[-1]
    out = bytearray(data)
    struct.pack_into(">I", out, stsz + 16, 10**6)
    return bytes(out)


@pytest.mark.parametrize(
    "kind, damage, message",
    [
        ("h264_bframes", lambda d: d[:-50], r"box 'moov' at byte \d+ declares \d+ bytes but only \d+ remain"),
        ("h264_faststart", lambda d: d[: len(d) // 2], r"sample \d+ ends at byte \d+ but the file has \d+ bytes"),
        ("h264_bframes", lambda d: d[:2000], r"box 'mdat' at byte \d+ declares"),
        ("h264_bframes", lambda d: b"", r"no 'moov' box"),
        # Neither the four bytes read as a type nor the size they make are echoed: they are the file's content.
        ("h264_bframes", lambda d: b"not an mp4 at all, just text",
         r"the bytes at 0 are not an MP4 box header \(an unknown type and a size that does not fit\): not an MP4 "
         r"file, or a corrupt one$"),
        ("h264_bframes", _inflate_stsz_count, r"'stsz' box declares 1000000 entries but holds only 72"),
        ("h264_bframes", lambda d: d[: top_level(d)[-1][1] + 3], r"3 stray bytes at byte \d+ where a box header"),
    ],
)
def test_damaged_files_raise_naming_the_file(clip_dir: Path, kind: str, damage, message: str) -> None:
    data = damage(make_mp4(clip_dir, kind).read_bytes())
    with pytest.raises(Mp4FormatError, match=rf"^broken\.mp4: {message}"):
        _index_bytes(data, name="broken.mp4")


def test_short_read_is_reported(clip_dir: Path) -> None:
    data = make_mp4(clip_dir, "h264_bframes").read_bytes()
    with pytest.raises(Mp4FormatError, match=r"^short\.mp4: asked for bytes \[\d+, \d+\) but got 10 bytes"):
        build_index(lambda start, end: data[start:end][:10], len(data), name="short.mp4")
