"""Mini-MP4 synthesis: one episode's samples wrapped in a fresh ftyp + moov + mdat.

The mini-MP4 keeps the source's presentation timestamps: its sample tables
start at decode time 0, and an edit list (an empty edit, then the media)
moves presentation back to where the source showed those frames. So the
decoder sees the same bitstream and reports the same pts as for the source.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from episodes._mp4.index import Mp4Index
from episodes._mp4.span import EpisodeSpan
from episodes.errors import Mp4FormatError

_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
_U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True, eq=False)
class MiniMp4:
    """A small, valid MP4 of one episode and how its frames map to the episode's.

    `pts`, `duration` and `is_key` describe every frame of the mini-MP4 in
    presentation order (ticks of `timescale`, same values as in the source);
    episode frame i is mini frame `frame_index[i]`.
    """

    data: bytes
    timescale: int
    pts: np.ndarray
    duration: np.ndarray
    is_key: np.ndarray
    frame_index: np.ndarray

    @property
    def num_frames(self) -> int:
        return len(self.frame_index)

    @property
    def frame_pts_seconds(self) -> np.ndarray:
        """Presentation time of each episode frame, in seconds of the source file's timeline."""
        return self.pts[self.frame_index] / self.timescale


def _box(box_type: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), box_type) + body


def _full_box(box_type: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(box_type, struct.pack(">I", (version << 24) | flags), *parts)


def _runs(values: np.ndarray) -> np.ndarray:
    """Run-length pairs (count, value) as a big-endian u32 table for stts/ctts."""
    starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
    counts = np.diff(np.append(starts, len(values)))
    return np.stack([counts, values[starts]], axis=1).astype(">u4")


def _table_box(box_type: bytes, rows: np.ndarray, version: int = 0) -> bytes:
    return _full_box(box_type, version, 0, struct.pack(">I", len(rows)), rows.tobytes())


def synthesize_mini_mp4(
    index: Mp4Index, span: EpisodeSpan, payload: bytes, *, chunk_offset_box: str = "stco"
) -> MiniMp4:
    """Wrap `payload` (source bytes [span.byte_start, span.byte_end)) into a mini-MP4.

    `chunk_offset_box` "co64" writes 64-bit chunk offsets; "stco" is smaller
    and is used whenever the file is under 4 GiB.
    """
    if chunk_offset_box not in ("stco", "co64"):
        raise ValueError(f"chunk_offset_box must be 'stco' or 'co64', not {chunk_offset_box!r}")
    if len(payload) != span.num_bytes:
        raise Mp4FormatError(
            f"{index.name}: payload for bytes [{span.byte_start}, {span.byte_end}) has {len(payload)} bytes"
        )
    run = slice(span.sample_start, span.sample_stop)
    size, start = index.size[run], index.offset[run] - span.byte_start
    packed = np.cumsum(size) - size
    if np.array_equal(start, packed) and packed[-1] + size[-1] == len(payload):
        samples = payload
    else:
        view = memoryview(payload)
        samples = b"".join(view[o : o + n] for o, n in zip(start.tolist(), size.tolist()))

    dts, pts, duration = index.dts[run], index.pts[run], index.duration[run]
    first_shown, last_shown = int(pts.min()), int((pts + duration).max())
    # Composition offsets must stay >= 0 and the media edit must start at >= 0.
    lift = max(0, int((dts - pts).max()), int(dts[0]) - first_shown)
    ctts = pts - dts + lift
    media_time = first_shown - int(dts[0]) + lift
    edits = [(first_shown, -1)] if first_shown > 0 else []
    edits.append((last_shown - first_shown, media_time))
    is_sync = index.is_sync[run]

    stbl_head = b"".join([
        index.stsd,
        _table_box(b"stts", _runs(duration)),
        _table_box(b"ctts", _runs(ctts)) if ctts.any() else b"",
        _table_box(b"stsc", np.array([[1, len(size), 1]], dtype=">u4")),
        _full_box(b"stsz", 0, 0, struct.pack(">II", 0, len(size)), size.astype(">u4").tobytes()),
    ])
    stss = b"" if is_sync.all() else _table_box(b"stss", (np.flatnonzero(is_sync) + 1).astype(">u4"))
    offset_dtype = ">u8" if chunk_offset_box == "co64" else ">u4"

    def moov_at(mdat_offset: int) -> bytes:
        chunk_offsets = _table_box(chunk_offset_box.encode(), np.array([mdat_offset], dtype=offset_dtype))
        return _moov(index, last_shown, int(duration.sum()), edits, stbl_head + chunk_offsets + stss)

    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso2mp41")
    if len(samples) + 8 > _U32_MAX:
        mdat_header = struct.pack(">I4sQ", 1, b"mdat", len(samples) + 16)
    else:
        mdat_header = struct.pack(">I4s", len(samples) + 8, b"mdat")
    moov = moov_at(len(ftyp) + len(moov_at(0)) + len(mdat_header))

    order = np.argsort(pts, kind="stable")
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    return MiniMp4(
        data=b"".join([ftyp, moov, mdat_header, samples]),
        timescale=index.timescale,
        pts=pts[order],
        duration=duration[order],
        is_key=is_sync[order],
        frame_index=position[np.asarray(span.frames, dtype=np.int64) - span.sample_start],
    )


def _moov(index: Mp4Index, movie_duration: int, media_duration: int, edits: list[tuple[int, int]], stbl: bytes) -> bytes:
    """moov with one video track whose movie and media timescales are the source's media timescale."""
    v = 1 if max(movie_duration, media_duration) > _U32_MAX else 0
    times = ">QQIQ" if v else ">IIII"
    mvhd = _full_box(
        b"mvhd", v, 0, struct.pack(times, 0, 0, index.timescale, movie_duration),
        struct.pack(">IH10x", 0x10000, 0x100), _MATRIX, bytes(24), struct.pack(">I", 2),
    )
    tkhd_times = struct.pack(">QQIIQ", 0, 0, 1, 0, movie_duration) if v else \
        struct.pack(">IIIII", 0, 0, 1, 0, movie_duration)
    tkhd = _full_box(
        b"tkhd", v, 3, tkhd_times, bytes(8), struct.pack(">hhH2x", 0, 0, 0), _MATRIX,
        struct.pack(">II", index.width << 16, index.height << 16),
    )
    elst_rows = struct.pack(">I", len(edits)) + b"".join(
        struct.pack(">Qqhh" if v else ">Iihh", duration, media_time, 1, 0) for duration, media_time in edits
    )
    edts = _box(b"edts", _full_box(b"elst", v, 0, elst_rows))
    mdhd = _full_box(b"mdhd", v, 0, struct.pack(times, 0, 0, index.timescale, media_duration), struct.pack(">HH", 0x55C4, 0))
    hdlr = _full_box(b"hdlr", 0, 0, bytes(4), b"vide", bytes(12), b"VideoHandler\0")
    vmhd = _full_box(b"vmhd", 0, 1, bytes(8))
    dinf = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1)))
    minf = _box(b"minf", vmhd, dinf, _box(b"stbl", stbl))
    trak = _box(b"trak", tkhd, edts, _box(b"mdia", mdhd, hdlr, minf))
    return _box(b"moov", mvhd, trak)
