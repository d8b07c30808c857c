"""ISO-BMFF box walking over byte-range reads.

The top level of a file is walked header by header (8 bytes per probe) so the
index never touches `mdat` payload; inside `moov`, which is read whole, boxes
are walked in memory.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from episodes._errors import Mp4FormatError

ReadRange = Callable[[int, int], bytes]

_PROBE = 16

# Box types that messages may name.  Any other four bytes are only data to us, and a message quoting them
# (or the size beside them) would echo the content of whatever file was read: the first words of a text file.
KNOWN_TYPES = frozenset({
    "ftyp", "styp", "moov", "mdat", "free", "skip", "wide", "uuid", "meta", "moof", "mfra", "pdin", "sidx",
    "mvhd", "trak", "tkhd", "edts", "elst", "mdia", "mdhd", "hdlr", "minf", "vmhd", "smhd", "dinf", "dref",
    "stbl", "stsd", "stts", "ctts", "stss", "stsz", "stz2", "stsc", "stco", "co64", "sgpd", "sbgp", "udta",
    "mvex", "trex", "avc1", "avc3", "avcC", "hvc1", "hev1", "hvcC", "av01", "av1C", "btrt", "pasp", "colr",
})


@dataclass(frozen=True)
class Box:
    """One box: its four-character type and where its payload lies.

    `start`/`end` bound the whole box; `payload_start` skips the header
    (8 bytes, 16 with a 64-bit size, plus 16 for a `uuid` user type).
    """

    type: str
    start: int
    payload_start: int
    end: int


def _parse_header(head: bytes, start: int, limit: int, name: str) -> Box:
    """Decode the header in `head` (read at `start`); the box may not pass `limit`."""
    if len(head) < 8:
        raise Mp4FormatError(f"{name}: box header at byte {start} is cut short (truncated file)")
    size, raw_type = struct.unpack_from(">I4s", head)
    box_type = raw_type.decode("latin-1")
    shown = f"box '{box_type}'" if box_type in KNOWN_TYPES else "box"
    header = 8
    if size == 1:
        if len(head) < 16:
            raise Mp4FormatError(f"{name}: 64-bit size of the {shown} at byte {start} is cut short")
        (size,) = struct.unpack_from(">Q", head, 8)
        header = 16
    elif size == 0:
        size = limit - start
    if box_type == "uuid":
        header += 16
    if (size < header or start + size > limit) and box_type not in KNOWN_TYPES:
        raise Mp4FormatError(f"{name}: the bytes at {start} are not an MP4 box header (an unknown type and a size "
                             "that does not fit): not an MP4 file, or a corrupt one")
    if size < header:
        raise Mp4FormatError(f"{name}: {shown} at byte {start} declares size {size}, smaller than its header")
    if start + size > limit:
        raise Mp4FormatError(
            f"{name}: {shown} at byte {start} declares {size} bytes but only "
            f"{limit - start} remain (truncated or corrupt file)"
        )
    return Box(box_type, start, start + header, start + size)


def read_exact(read_range: ReadRange, start: int, end: int, name: str) -> bytes:
    """Read [start, end) and insist on getting every byte: a short read means a truncated source."""
    data = read_range(start, end)
    if len(data) != end - start:
        raise Mp4FormatError(
            f"{name}: asked for bytes [{start}, {end}) but got {len(data)} bytes (file shorter than its boxes say)"
        )
    return data


def top_level_boxes(read_range: ReadRange, file_size: int, name: str) -> Iterator[Box]:
    """Yield the file's top-level boxes, reading only their headers (8 bytes, 16 for 64-bit sizes)."""
    pos = 0
    while pos < file_size:
        if file_size - pos < 8:
            raise Mp4FormatError(f"{name}: {file_size - pos} stray bytes at byte {pos} where a box header should be")
        head = read_exact(read_range, pos, pos + 8, name)
        if head[:4] == b"\0\0\0\1":
            head += read_exact(read_range, pos + 8, min(pos + 16, file_size), name)
        box = _parse_header(head, pos, file_size, name)
        yield box
        pos = box.end


def child_boxes(buf: bytes, parent: Box, name: str, *, skip: int = 0) -> Iterator[Box]:
    """Yield the children of `parent`; positions here are offsets into `buf`.

    `skip` is the number of payload bytes before the first child (e.g. 8 for
    `stsd`'s version, flags and entry count).
    """
    pos = parent.payload_start + skip
    while pos < parent.end:
        box = _parse_header(buf[pos : pos + _PROBE], pos, parent.end, name)
        yield box
        pos = box.end


def find_child(buf: bytes, parent: Box, box_type: str, name: str) -> Box | None:
    """The first child of `parent` with type `box_type`, or None."""
    return next((b for b in child_boxes(buf, parent, name) if b.type == box_type), None)


def require_child(buf: bytes, parent: Box, box_type: str, name: str) -> Box:
    """Like find_child, but a missing box is a format error naming the parent."""
    box = find_child(buf, parent, box_type, name)
    if box is None:
        raise Mp4FormatError(f"{name}: box '{parent.type}' at byte {parent.start} has no '{box_type}' box")
    return box
