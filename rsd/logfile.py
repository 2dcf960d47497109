"""The on-disk framing shared by journal segments and snapshots.

A file starts with a 20-byte header: magic (4 bytes, ``RSDJ`` for a journal segment,
``RSDS`` for a snapshot), format version (u16), flags (u16), sequence number (u64) and
the CRC-32 of those 16 bytes (u32), all big-endian. Frames follow back to back, each
a u32 payload length, the u32 CRC-32 of the payload, and the payload: one msgpack
array, either one record (an array whose first element is its integer type) or a batch
of records (an array of such arrays). The journal writes one batch frame per write, so
a batch is the unit that is whole or torn, and decoding it is one msgpack call.

A reader that meets a frame it cannot trust tells a torn tail (nothing valid follows:
a crash cut the last write) from damage in the middle (valid frames follow: the file
was corrupted), because the two call for different actions.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "JOURNAL_MAGIC",
    "MAX_RECORD_BYTES",
    "SNAPSHOT_MAGIC",
    "FileDamaged",
    "Scan",
    "encode_batch",
    "encode_record",
    "file_header",
    "fsync_dir",
    "scan",
]

JOURNAL_MAGIC = b"RSDJ"
SNAPSHOT_MAGIC = b"RSDS"
FORMAT_VERSION = 1
MAX_RECORD_BYTES = 8 << 20

_HEADER = struct.Struct(">4sHHQ")
_RECORD = struct.Struct(">II")
HEADER_BYTES = _HEADER.size + 4
RECORD_HEADER_BYTES = _RECORD.size


class FileDamaged(Exception):
    """A file whose header is unreadable or of an unknown format or version."""


def file_header(magic: bytes, seq: int) -> bytes:
    head = _HEADER.pack(magic, FORMAT_VERSION, 0, seq)
    return head + struct.pack(">I", zlib.crc32(head))


def encode_record(rec: Any) -> bytes:
    """A frame holding one record."""
    payload = msgpack.packb(rec, use_bin_type=True)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


FRAME_TARGET_BYTES = 1 << 20  # batches are split into frames of about this size at most


def encode_batch(records: list[Any]) -> bytes:
    """Frames holding a batch of records (the journal's unit of writing), each well
    under MAX_RECORD_BYTES: a large batch is split in halves until each part fits."""
    payload = msgpack.packb(records, use_bin_type=True)
    if len(payload) > FRAME_TARGET_BYTES and len(records) > 1:
        half = len(records) // 2
        return encode_batch(records[:half]) + encode_batch(records[half:])
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Scan:
    """What a file holds: its records up to ``good_end``, and what stopped the reading."""

    seq: int
    records: list[Any] = field(default_factory=list)
    good_end: int = HEADER_BYTES
    size: int = 0
    damage: str | None = None  # why reading stopped before the end, or None
    damage_at: int | None = None  # the offset of the first record not trusted
    torn_tail: bool = False  # nothing valid after the damage: a cut-off last write


def _record_at(data: bytes, pos: int) -> tuple[list[Any], int] | str:
    """The records of the frame at ``pos`` and the offset after it, or why there are none."""
    if len(data) - pos < RECORD_HEADER_BYTES:
        return "record header cut short"
    size, crc = _RECORD.unpack_from(data, pos)
    if size == 0 or size > MAX_RECORD_BYTES:
        return f"implausible record length {size}"
    start = pos + RECORD_HEADER_BYTES
    end = start + size
    if end > len(data):
        return "record cut short"
    payload = memoryview(data)[start:end]
    if zlib.crc32(payload) != crc:
        return "CRC mismatch"
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        return f"undecodable record ({exc})"
    if type(value) is not list or not value:
        return "frame is not a record or a batch"
    if type(value[0]) is int:
        return [value], end
    for rec in value:
        if type(rec) is not list or not rec or type(rec[0]) is not int:
            return "batch holds something that is not a typed record"
    return value, end


_ARRAY_STARTS = frozenset([*range(0x91, 0xA0), 0xDC, 0xDD])  # msgpack array headers


def _frames_after(data: bytes, pos: int) -> bool:
    """Whether a valid frame starts anywhere after ``pos``. Frames are < 16 MiB, so a
    frame starts with a zero byte and its payload with an array header: only offsets
    that pass both cheap tests are decoded."""
    end = len(data) - RECORD_HEADER_BYTES
    at = data.find(b"\x00", pos)
    while 0 <= at < end:
        if data[at + RECORD_HEADER_BYTES] in _ARRAY_STARTS and not isinstance(
            _record_at(data, at), str
        ):
            return True
        at = data.find(b"\x00", at + 1)
    return False


def _damage_is_torn_tail(data: bytes, pos: int) -> bool:
    """A frame at ``pos`` failed. Is it the cut-off last write, or damage in the middle?

    The last write is one frame appended at the end, so everything from ``pos`` to the
    end of the file belongs to that frame: when its declared length fits in the file,
    valid frames after its end prove damage in the middle. When it runs past the end,
    the rest of the file is its payload (client data, which may look like frames): it
    is damage in the middle only if valid frames chain from inside it to the very end
    of the file, which a cut payload does not do.
    """
    if len(data) - pos < RECORD_HEADER_BYTES:
        return True
    size = int.from_bytes(data[pos : pos + 4], "big")
    declared_end = pos + RECORD_HEADER_BYTES + size
    if 0 < size <= MAX_RECORD_BYTES and declared_end <= len(data):
        return not _frames_after(data, declared_end - 1)
    at = data.find(b"\x00", pos + 1)
    while 0 <= at < len(data) - RECORD_HEADER_BYTES:
        if _chains_to_end(data, at):
            return False
        at = data.find(b"\x00", at + 1)
    return True


def _chains_to_end(data: bytes, at: int) -> bool:
    count = 0
    while at < len(data):
        got = _record_at(data, at)
        if isinstance(got, str):
            return False
        at = got[1]
        count += 1
    return count > 0


def scan(path: Path, magic: bytes) -> Scan:
    """Read every record of a segment or snapshot file. Raises FileDamaged on a bad header."""
    data = path.read_bytes()
    if len(data) < HEADER_BYTES:
        raise FileDamaged(f"{path}: file header cut short ({len(data)} bytes)")
    file_magic, version, _flags, seq = _HEADER.unpack_from(data, 0)
    (crc,) = struct.unpack_from(">I", data, _HEADER.size)
    if file_magic != magic or zlib.crc32(data[: _HEADER.size]) != crc:
        raise FileDamaged(f"{path}: not an rsd {magic.decode()} file, or its header is damaged")
    if version != FORMAT_VERSION:
        raise FileDamaged(f"{path}: format version {version}; this rsd reads {FORMAT_VERSION}")
    result = Scan(seq=seq, size=len(data))
    pos = HEADER_BYTES
    while pos < len(data):
        got = _record_at(data, pos)
        if isinstance(got, str):
            result.damage = got
            result.damage_at = pos
            result.torn_tail = _damage_is_torn_tail(data, pos)
            break
        records, pos = got
        result.records.extend(records)
        result.good_end = pos
    return result
