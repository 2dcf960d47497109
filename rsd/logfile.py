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


def encode_batch(records: list[Any]) -> bytes:
    """A frame holding a batch of records (the journal's unit of writing)."""
    payload = msgpack.packb(records, use_bin_type=True)
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


def _valid_record_after(data: bytes, pos: int) -> bool:
    for at in range(pos + 1, len(data) - RECORD_HEADER_BYTES):
        size = int.from_bytes(data[at : at + 4], "big")
        if 0 < size <= len(data) - at - RECORD_HEADER_BYTES and not isinstance(
            _record_at(data, at), str
        ):
            return True
    return False


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
            result.torn_tail = not _valid_record_after(data, pos)
            break
        records, pos = got
        result.records.extend(records)
        result.good_end = pos
    return result
