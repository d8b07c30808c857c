"""Mp4Index: the video track of one MP4, as per-sample arrays, from range reads only."""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import numpy as np

from episodes._errors import Mp4FormatError
from episodes._mp4 import sample_table as st
from episodes._mp4.boxes import Box, ReadRange, child_boxes, find_child, read_exact, require_child, top_level_boxes

_ARRAYS = ("dts", "pts", "duration", "size", "offset", "is_sync")


@dataclass(frozen=True, eq=False)
class Mp4Index:
    """Where every sample of a file's first video track lies and when it is shown.

    Arrays are in decode order. `dts` counts from 0 as `stts` says; `pts` is
    the presentation time after `ctts` and the edit list, i.e. the timestamp
    FFmpeg (and so torchcodec) reports. Both are in `timescale` ticks.
    `stsd` is the raw sample-description box, copied verbatim into mini-MP4s.
    """

    name: str
    timescale: int
    width: int
    height: int
    codec: str
    stsd: bytes
    dts: np.ndarray
    pts: np.ndarray
    duration: np.ndarray
    size: np.ndarray
    offset: np.ndarray
    is_sync: np.ndarray

    @property
    def num_samples(self) -> int:
        return len(self.dts)

    @functools.cached_property
    def pts_seconds(self) -> np.ndarray:
        """`pts` in seconds, worked out once: every read planned over the file looks its frames up in it."""
        return self.pts / self.timescale

    @functools.cached_property
    def half_frame_s(self) -> float:
        """Half the file's median frame duration, in seconds: how far a timestamp may lie from its frame."""
        return 0.5 * float(np.median(self.duration)) / self.timescale

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything but the name, as numpy arrays, for an npz or Arrow sidecar."""
        arrays = {key: getattr(self, key) for key in _ARRAYS}
        arrays["scalars"] = np.array([self.timescale, self.width, self.height], dtype=np.int64)
        arrays["codec"] = np.frombuffer(self.codec.encode("latin-1"), dtype=np.uint8)
        arrays["stsd"] = np.frombuffer(self.stsd, dtype=np.uint8)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], *, name: str) -> Mp4Index:
        """Rebuild an index stored with to_arrays; a missing key is a format error naming `name`."""
        missing = [key for key in (*_ARRAYS, "scalars", "codec", "stsd") if key not in arrays]
        if missing:
            raise Mp4FormatError(f"{name}: stored MP4 index lacks {', '.join(missing)}")
        timescale, width, height = (int(v) for v in arrays["scalars"])
        return cls(
            name=name,
            timescale=timescale,
            width=width,
            height=height,
            codec=bytes(np.asarray(arrays["codec"], dtype=np.uint8)).decode("latin-1"),
            stsd=bytes(np.asarray(arrays["stsd"], dtype=np.uint8)),
            **{key: np.asarray(arrays[key]) for key in _ARRAYS},
        )


def build_index(read_range: ReadRange, file_size: int, *, name: str) -> Mp4Index:
    """Index the first video track of an MP4 reading only box headers and `moov`.

    `read_range(start, end)` must return bytes [start, end) of the file.
    """
    moov = next((box for box in top_level_boxes(read_range, file_size, name) if box.type == "moov"), None)
    if moov is None:
        raise Mp4FormatError(f"{name}: no 'moov' box (not an MP4 file, or truncated before its index)")
    buf = read_exact(read_range, moov.start, moov.end, name)
    root = Box("moov", 0, moov.payload_start - moov.start, moov.end - moov.start)
    mvhd = require_child(buf, root, "mvhd", name)
    movie_timescale = st.parse_mvhd_timescale(buf[mvhd.payload_start : mvhd.end], name)
    trak = _first_video_trak(buf, root, name)
    index = _parse_trak(buf, trak, movie_timescale, name)
    last = np.argmax(index.offset + index.size) if index.num_samples else None
    if last is not None and index.offset[last] + index.size[last] > file_size:
        raise Mp4FormatError(
            f"{name}: sample {last} ends at byte {index.offset[last] + index.size[last]} "
            f"but the file has {file_size} bytes (truncated)"
        )
    return index


def _payload(buf: bytes, box: Box) -> bytes:
    return buf[box.payload_start : box.end]


def _first_video_trak(buf: bytes, root: Box, name: str) -> Box:
    for trak in child_boxes(buf, root, name):
        if trak.type != "trak":
            continue
        mdia = require_child(buf, trak, "mdia", name)
        if st.parse_hdlr(_payload(buf, require_child(buf, mdia, "hdlr", name)), name) == "vide":
            return trak
    raise Mp4FormatError(f"{name}: no video track (no 'trak' whose handler is 'vide')")


def _parse_trak(buf: bytes, trak: Box, movie_timescale: int, name: str) -> Mp4Index:
    mdia = require_child(buf, trak, "mdia", name)
    timescale = st.parse_mdhd(_payload(buf, require_child(buf, mdia, "mdhd", name)), name)
    stbl = require_child(buf, require_child(buf, mdia, "minf", name), "stbl", name)
    boxes = {box.type: box for box in child_boxes(buf, stbl, name)}

    stsd = require_child(buf, stbl, "stsd", name)
    codec, width, height = _sample_entry(buf, stsd, name)

    duration = st.parse_stts(_payload(buf, require_child(buf, stbl, "stts", name)), name)
    count = len(duration)
    size = _sample_sizes(buf, boxes, count, name)

    chunk_box = boxes.get("stco") or boxes.get("co64")
    if chunk_box is None:
        raise Mp4FormatError(f"{name}: video track has neither 'stco' nor 'co64' box")
    chunk_offsets = st.parse_chunk_offsets(_payload(buf, chunk_box), chunk_box.type, name)
    stsc = st.parse_stsc(_payload(buf, require_child(buf, stbl, "stsc", name)), name)
    offset = _sample_offsets(stsc, chunk_offsets, size, name)

    if "ctts" in boxes:
        ctts = st.parse_ctts(_payload(buf, boxes["ctts"]), name)
        if len(ctts) != count:
            raise Mp4FormatError(f"{name}: 'ctts' box covers {len(ctts)} samples but the track has {count}")
    else:
        ctts = np.zeros(count, dtype=np.int64)
    is_sync = st.parse_stss(_payload(buf, boxes["stss"]), count, name) if "stss" in boxes else np.ones(count, bool)

    dts = np.concatenate([[0], np.cumsum(duration)[:-1]]).astype(np.int64) if count else np.zeros(0, np.int64)
    shift = _edit_shift(buf, trak, timescale, movie_timescale, name)
    return Mp4Index(
        name=name,
        timescale=timescale,
        width=width,
        height=height,
        codec=codec,
        stsd=bytes(buf[stsd.start : stsd.end]),
        dts=dts,
        pts=dts + ctts + shift,
        duration=duration,
        size=size,
        offset=offset,
        is_sync=is_sync,
    )


def _sample_sizes(buf: bytes, boxes: dict[str, Box], count: int, name: str) -> np.ndarray:
    """Each sample's size, from whichever of 'stsz' and 'stz2' the track has: one per sample duration."""
    if "stsz" in boxes:
        size = st.parse_stsz(_payload(buf, boxes["stsz"]), name)
    elif "stz2" in boxes:
        size = st.parse_stz2(_payload(buf, boxes["stz2"]), name)
    else:
        raise Mp4FormatError(f"{name}: video track has neither 'stsz' nor 'stz2' box")
    if len(size) != count:
        raise Mp4FormatError(f"{name}: video track lists {len(size)} sample sizes but {count} sample durations")
    return size


def _sample_entry(buf: bytes, stsd: Box, name: str) -> tuple[str, int, int]:
    """Codec fourcc, width and height from the first visual sample entry."""
    entry = next(child_boxes(buf, stsd, name, skip=8), None)
    if entry is None or entry.end - entry.payload_start < 28:
        raise Mp4FormatError(f"{name}: 'stsd' box holds no visual sample entry")
    width, height = struct.unpack_from(">HH", buf, entry.payload_start + 24)
    return entry.type, width, height


def _sample_offsets(stsc: np.ndarray, chunk_offsets: np.ndarray, size: np.ndarray, name: str) -> np.ndarray:
    """File offset of every sample: its chunk's offset plus the sizes before it in that chunk."""
    count, chunks = len(size), len(chunk_offsets)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    if len(stsc) == 0 or stsc[0, 0] != 1 or np.any(np.diff(stsc[:, 0]) <= 0) or stsc[-1, 0] > chunks:
        raise Mp4FormatError(f"{name}: 'stsc' box does not describe the track's {chunks} chunks in order")
    run_lengths = np.diff(np.append(stsc[:, 0], chunks + 1))
    per_chunk = np.repeat(stsc[:, 1], run_lengths)
    if per_chunk.sum() < count:
        raise Mp4FormatError(
            f"{name}: chunks hold {per_chunk.sum()} samples by 'stsc' but the track has {count} samples"
        )
    chunk_of_sample = np.repeat(np.arange(chunks), per_chunk)[:count]
    before = np.cumsum(size) - size
    first_in_chunk = (np.cumsum(per_chunk) - per_chunk)[chunk_of_sample]
    return chunk_offsets[chunk_of_sample] + before - before[first_in_chunk]


def _edit_shift(buf: bytes, trak: Box, timescale: int, movie_timescale: int, name: str) -> int:
    """Ticks added to dts+ctts by the edit list: leading empty edits minus the media start time.

    Only what muxers write is supported: empty edits followed by at most one
    media edit; more media edits would need FFmpeg's frame-dropping rules.
    """
    edts = find_child(buf, trak, "edts", name)
    elst = find_child(buf, edts, "elst", name) if edts else None
    if elst is None:
        return 0
    empty = 0
    media_times: list[int] = []
    for edit in st.parse_elst(_payload(buf, elst), name):
        if edit.media_time == -1 and not media_times:
            empty += edit.duration
        elif edit.media_time != -1:
            media_times.append(edit.media_time)
    if len(media_times) > 1:
        raise Mp4FormatError(f"{name}: edit list has {len(media_times)} media edits; only one is supported")
    # FFmpeg rescales the empty duration into the media timescale rounding to nearest.
    empty_ticks = (empty * timescale + movie_timescale // 2) // movie_timescale
    return empty_ticks - (media_times[0] if media_times else 0)
