"""Parsers for the sample-table and header boxes of one track.

Each takes the payload of one box (after its 8/16-byte header) and returns
numpy arrays, so a track of 100k samples costs a few vectorised operations.
Every count is checked against the payload length: a corrupt count must become
an Mp4FormatError, never a huge allocation or a silent misread.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from episodes._errors import Mp4FormatError


@dataclass(frozen=True)
class Edit:
    """One `elst` entry; media_time -1 marks an empty edit (a gap in presentation)."""

    duration: int  # movie timescale
    media_time: int  # media timescale


def _version(payload: bytes, box: str, name: str) -> int:
    if len(payload) < 4:
        raise Mp4FormatError(f"{name}: '{box}' box is too short to hold its version and flags")
    return payload[0]


def _table(payload: bytes, offset: int, count: int, dtype: str, box: str, name: str) -> np.ndarray:
    """`count` records of `dtype` at `offset`, after checking the payload holds them."""
    itemsize = np.dtype(dtype).itemsize
    if offset + count * itemsize > len(payload):
        raise Mp4FormatError(
            f"{name}: '{box}' box declares {count} entries but holds only {(len(payload) - offset) // itemsize}"
        )
    return np.frombuffer(payload, dtype=dtype, count=count, offset=offset)


def _count(payload: bytes, offset: int, box: str, name: str) -> int:
    if len(payload) < offset + 4:
        raise Mp4FormatError(f"{name}: '{box}' box is too short to hold its entry count")
    return struct.unpack_from(">I", payload, offset)[0]


def parse_mdhd(payload: bytes, name: str) -> int:
    """The media timescale (ticks per second) of the track."""
    return _timescale(payload, "mdhd", name)


def parse_mvhd_timescale(payload: bytes, name: str) -> int:
    """The movie timescale, in which edit durations are expressed."""
    return _timescale(payload, "mvhd", name)


def _timescale(payload: bytes, box: str, name: str) -> int:
    """mdhd and mvhd keep their timescale at the same place: after two times of 4 or 8 bytes."""
    offset = 20 if _version(payload, box, name) == 1 else 12
    if len(payload) < offset + 4:
        raise Mp4FormatError(f"{name}: '{box}' box is too short to hold its timescale")
    (timescale,) = struct.unpack_from(">I", payload, offset)
    if timescale == 0:
        raise Mp4FormatError(f"{name}: '{box}' box has a timescale of 0")
    return timescale


def parse_hdlr(payload: bytes, name: str) -> str:
    """The handler type ('vide', 'soun', ...)."""
    if len(payload) < 12:
        raise Mp4FormatError(f"{name}: 'hdlr' box is too short to hold its handler type")
    return payload[8:12].decode("latin-1")


def parse_stts(payload: bytes, name: str) -> np.ndarray:
    """Per-sample durations (decode-time deltas)."""
    _version(payload, "stts", name)
    count = _count(payload, 4, "stts", name)
    runs = _table(payload, 8, 2 * count, ">u4", "stts", name).reshape(-1, 2)
    return np.repeat(runs[:, 1].astype(np.int64), runs[:, 0].astype(np.int64))


def parse_ctts(payload: bytes, name: str) -> np.ndarray:
    """Per-sample composition offsets.

    Read as signed in both versions, as FFmpeg does: muxers have written
    negative offsets into version-0 boxes.
    """
    _version(payload, "ctts", name)
    count = _count(payload, 4, "ctts", name)
    runs = _table(payload, 8, 2 * count, ">u4", "ctts", name).reshape(-1, 2)
    return np.repeat(runs[:, 1].view(">i4").astype(np.int64), runs[:, 0].astype(np.int64))


def parse_stsz(payload: bytes, name: str) -> np.ndarray:
    """Per-sample sizes from `stsz` (a constant size or one entry per sample)."""
    _version(payload, "stsz", name)
    if len(payload) < 12:
        raise Mp4FormatError(f"{name}: 'stsz' box is too short to hold its sample size and count")
    constant, count = struct.unpack_from(">II", payload, 4)
    if constant:
        return np.full(count, constant, dtype=np.int64)
    return _table(payload, 12, count, ">u4", "stsz", name).astype(np.int64)


def parse_stz2(payload: bytes, name: str) -> np.ndarray:
    """Per-sample sizes from the compact `stz2` (4-, 8- or 16-bit fields)."""
    _version(payload, "stz2", name)
    if len(payload) < 12:
        raise Mp4FormatError(f"{name}: 'stz2' box is too short to hold its field size and count")
    field_size = payload[7]
    (count,) = struct.unpack_from(">I", payload, 8)
    if field_size == 4:
        packed = _table(payload, 12, (count + 1) // 2, "u1", "stz2", name)
        return np.stack([packed >> 4, packed & 0x0F], axis=1).reshape(-1)[:count].astype(np.int64)
    if field_size in (8, 16):
        return _table(payload, 12, count, "u1" if field_size == 8 else ">u2", "stz2", name).astype(np.int64)
    raise Mp4FormatError(f"{name}: 'stz2' box has field size {field_size}; only 4, 8 and 16 are valid")


def parse_stsc(payload: bytes, name: str) -> np.ndarray:
    """Rows of (first_chunk, samples_per_chunk, sample_description_index), first_chunk 1-based."""
    _version(payload, "stsc", name)
    count = _count(payload, 4, "stsc", name)
    return _table(payload, 8, 3 * count, ">u4", "stsc", name).reshape(-1, 3).astype(np.int64)


def parse_chunk_offsets(payload: bytes, box: str, name: str) -> np.ndarray:
    """Chunk file offsets from `stco` (32-bit) or `co64` (64-bit)."""
    _version(payload, box, name)
    count = _count(payload, 4, box, name)
    return _table(payload, 8, count, ">u4" if box == "stco" else ">u8", box, name).astype(np.int64)


def parse_stss(payload: bytes, sample_count: int, name: str) -> np.ndarray:
    """A per-sample sync flag from the 1-based sample numbers listed in `stss`."""
    _version(payload, "stss", name)
    count = _count(payload, 4, "stss", name)
    numbers = _table(payload, 8, count, ">u4", "stss", name).astype(np.int64)
    if count and (numbers.min() < 1 or numbers.max() > sample_count):
        raise Mp4FormatError(f"{name}: 'stss' box names a sample outside 1..{sample_count}")
    is_sync = np.zeros(sample_count, dtype=bool)
    is_sync[numbers - 1] = True
    return is_sync


def parse_elst(payload: bytes, name: str) -> list[Edit]:
    """The edit list entries; rates other than 1 are refused, as nothing we read uses them."""
    version = _version(payload, "elst", name)
    count = _count(payload, 4, "elst", name)
    entry = 20 if version == 1 else 12
    fmt = ">Qqhh" if version == 1 else ">Iihh"
    if 8 + count * entry > len(payload):
        raise Mp4FormatError(f"{name}: 'elst' box declares {count} entries but is only {len(payload)} bytes long")
    edits = []
    for i in range(count):
        duration, media_time, rate, _fraction = struct.unpack_from(fmt, payload, 8 + i * entry)
        if media_time != -1 and rate != 1:
            raise Mp4FormatError(f"{name}: edit list entry {i} has playback rate {rate}; only rate 1 is supported")
        edits.append(Edit(int(duration), int(media_time)))
    return edits
