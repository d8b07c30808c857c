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

from episodes._errors import Mp4FormatError
from episodes._mp4.index import Mp4Index
from episodes._mp4.span import EpisodeSpan

_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
_U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True, eq=False)
class MiniMp4:
    """A small, valid MP4 of some or all of one episode's frames, and where each of them sits in it.

    `pts`, `duration` and `is_key` describe every frame of the mini-MP4 in
    presentation order (ticks of `timescale`, same values as in the source).
    It holds the episode frames `frame_numbers` (ascending) of the
    `episode_frames` the episode has; episode frame `frame_numbers[j]` is
    mini frame `frame_index[j]`. A whole-episode mini-MP4 holds them all; a
    frame-window one holds the frames asked for (other samples it carries
    only serve to decode them).
    """

    data: bytes
    timescale: int
    pts: np.ndarray
    duration: np.ndarray
    is_key: np.ndarray
    frame_index: np.ndarray
    frame_numbers: np.ndarray
    episode_frames: int

    @property
    def num_frames(self) -> int:
        """How many episode frames it holds."""
        return len(self.frame_index)

    @property
    def whole_episode(self) -> bool:
        return self.num_frames == self.episode_frames

    @property
    def frame_pts_seconds(self) -> np.ndarray:
        """Presentation time of each held episode frame, in seconds of the source file's timeline."""
        return self.pts[self.frame_index] / self.timescale

    def mini_frames(self, frame_numbers: np.ndarray) -> np.ndarray:
        """Mini frame positions of episode frames `frame_numbers`; one it does not hold is an IndexError."""
        numbers = np.asarray(frame_numbers, dtype=np.int64).reshape(-1)
        slots = np.minimum(np.searchsorted(self.frame_numbers, numbers), max(self.num_frames - 1, 0))
        missing = numbers[(self.frame_numbers[slots] != numbers) if self.num_frames else np.ones(len(numbers), bool)]
        if len(missing):
            if not 0 <= missing[0] < self.episode_frames:
                raise IndexError(f"episode frame {int(missing[0])} is out of range: "
                                 f"the episode has {self.episode_frames} frames")
            raise IndexError(f"episode frame {int(missing[0])} is not among the {self.num_frames} frames "
                             "this frame-window mini-MP4 holds")
        return self.frame_index[slots]


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
    """Wrap `payload` (source bytes [span.byte_start, span.byte_end)) into a mini-MP4 of the whole episode.

    `chunk_offset_box` "co64" writes 64-bit chunk offsets; "stco" is smaller
    and is used whenever the file is under 4 GiB.
    """
    if len(payload) != span.num_bytes:
        raise Mp4FormatError(
            f"{index.name}: payload for bytes [{span.byte_start}, {span.byte_end}) has {len(payload)} bytes"
        )
    samples = np.arange(span.sample_start, span.sample_stop)
    frames = np.asarray(span.frames, dtype=np.int64)
    return build_mini_mp4(index, samples, gather_samples(index, samples, payload, span.byte_start),
                          frames, np.arange(len(frames)), len(frames), chunk_offset_box=chunk_offset_box)


def gather_samples(index: Mp4Index, samples: np.ndarray, blob: bytes | memoryview, blob_start: int) -> bytes:
    """The bytes of `samples`, back to back, cut from `blob`, which holds the source from byte `blob_start`.

    A run stored contiguously (no other track interleaved) is one slice.
    """
    size, start = index.size[samples], index.offset[samples] - blob_start
    if len(samples) and (start.min() < 0 or (start + size).max() > len(blob)):
        raise Mp4FormatError(f"{index.name}: samples lie outside the {len(blob)} bytes fetched from byte {blob_start}")
    packed = np.cumsum(size) - size
    total = int(size.sum())
    if len(samples) and np.array_equal(start - start[0], packed):
        if start[0] == 0 and total == len(blob) and isinstance(blob, bytes):
            return blob
        return bytes(memoryview(blob)[start[0] : start[0] + total])
    view = memoryview(blob)
    return b"".join(view[o : o + n] for o, n in zip(start.tolist(), size.tolist()))


def build_mini_mp4(
    index: Mp4Index, samples: np.ndarray, sample_data: bytes, frame_samples: np.ndarray, frame_numbers: np.ndarray,
    episode_frames: int, *, chunk_offset_box: str = "stco",
) -> MiniMp4:
    """A mini-MP4 of source `samples` (ascending decode order, any gaps between runs) whose bytes are `sample_data`.

    It holds episode frames `frame_numbers` (ascending) of the episode's
    `episode_frames`, shown by source samples `frame_samples`. Where samples are skipped, the sample before
    the gap lasts until the next one starts, so every decode time, and so
    every presentation time, stays the source's.
    """
    if chunk_offset_box not in ("stco", "co64"):
        raise ValueError(f"chunk_offset_box must be 'stco' or 'co64', not {chunk_offset_box!r}")
    samples = np.asarray(samples, dtype=np.int64)
    size = index.size[samples]
    if int(size.sum()) != len(sample_data):
        raise Mp4FormatError(f"{index.name}: {len(samples)} samples need {int(size.sum())} bytes, got {len(sample_data)}")
    dts, pts, duration = index.dts[samples], index.pts[samples], index.duration[samples]
    stts = np.append(np.diff(dts), duration[-1])
    first_shown, last_shown = int(pts.min()), int((pts + duration).max())
    # Composition offsets must stay >= 0 and the media edit must start at >= 0.
    lift = max(0, int((dts - pts).max()), int(dts[0]) - first_shown)
    ctts = pts - dts + lift
    edits = [(first_shown, -1)] if first_shown > 0 else []
    edits.append((last_shown - first_shown, first_shown - int(dts[0]) + lift))
    is_sync = index.is_sync[samples]
    stbl_head = b"".join([
        index.stsd,
        _table_box(b"stts", _runs(stts)),
        _table_box(b"ctts", _runs(ctts)) if ctts.any() else b"",
        _table_box(b"stsc", np.array([[1, len(size), 1]], dtype=">u4")),
        _full_box(b"stsz", 0, 0, struct.pack(">II", 0, len(size)), size.astype(">u4").tobytes()),
    ])
    stss = b"" if is_sync.all() else _table_box(b"stss", (np.flatnonzero(is_sync) + 1).astype(">u4"))
    data = _assemble(index, sample_data, last_shown, int(stts.sum()), edits, stbl_head, stss, chunk_offset_box)
    order = np.argsort(pts, kind="stable")
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    return MiniMp4(
        data=data,
        timescale=index.timescale,
        pts=pts[order],
        duration=duration[order],
        is_key=is_sync[order],
        frame_index=position[np.searchsorted(samples, np.asarray(frame_samples, dtype=np.int64))],
        frame_numbers=np.asarray(frame_numbers, dtype=np.int64),
        episode_frames=int(episode_frames),
    )


def _assemble(index: Mp4Index, samples: bytes, movie_duration: int, media_duration: int,
              edits: list[tuple[int, int]], stbl_head: bytes, stss: bytes, chunk_offset_box: str) -> bytes:
    """ftyp + moov + mdat, the one chunk offset pointing just past the mdat header."""
    offset_dtype = ">u8" if chunk_offset_box == "co64" else ">u4"

    def moov_at(mdat_offset: int) -> bytes:
        chunk_offsets = _table_box(chunk_offset_box.encode(), np.array([mdat_offset], dtype=offset_dtype))
        return _moov(index, movie_duration, media_duration, edits, stbl_head + chunk_offsets + stss)

    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso2mp41")
    if len(samples) + 8 > _U32_MAX:
        mdat_header = struct.pack(">I4sQ", 1, b"mdat", len(samples) + 16)
    else:
        mdat_header = struct.pack(">I4s", len(samples) + 8, b"mdat")
    moov = moov_at(len(ftyp) + len(moov_at(0)) + len(mdat_header))
    return b"".join([ftyp, moov, mdat_header, samples])


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
