"""Format version 1 of journal segments and snapshots: read, never written.

rsd before format version 2 wrote these files, so a data directory it left behind is
still recovered; rsd itself writes only the newest version (logfile.py), and the segments and
snapshots of version 1 go away as the first snapshot covers them.

A version 1 file starts with a 20-byte header: magic (4 bytes), format version (u16,
1), flags (u16), sequence number (u64) and the CRC-32 of those 16 bytes (u32), all
big-endian. Frames follow back to back, each a u32 payload length, the u32 CRC-32 of
the payload, and the payload (as in version 2).

What always holds, and what does not:
- a frame that fails is a torn tail unless valid frames follow it: after its declared
  end when that fits in the file, or chaining from inside it to the very end of the
  file when it does not (the cut payload of the last write);
- nothing in this format tells a frame rsd wrote from client bytes laid out as one, so
  a torn last write whose payload holds such bytes can still read as damage in the
  middle (refused without ``--repair``). That is why version 2 salts its frames;
- each offset is checked at most once on the way to the end of the file (``_Chains``
  remembers what it found), so frame-like payloads do not make the scan quadratic.

The encoders here exist for tests and benchmarks that need version 1 files.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from .logfile import MAX_RECORD_BYTES, Scan, records_of

__all__ = ["HEADER_BYTES", "encode_batch", "encode_record", "file_header", "scan_frames"]

VERSION = 1
_HEADER = struct.Struct(">4sHHQ")
_RECORD = struct.Struct(">II")
HEADER_BYTES = _HEADER.size + 4
RECORD_HEADER_BYTES = _RECORD.size


def file_header(magic: bytes, seq: int) -> bytes:
    head = _HEADER.pack(magic, VERSION, 0, seq)
    return head + struct.pack(">I", zlib.crc32(head))


def encode_record(rec: Any) -> bytes:
    """A version 1 frame holding one record."""
    payload = msgpack.packb(rec, use_bin_type=True)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def encode_batch(records: list[Any]) -> bytes:
    """A version 1 frame holding a batch of records."""
    payload = msgpack.packb(records, use_bin_type=True)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


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
    records = records_of(payload)
    if isinstance(records, str):
        return records
    return records, end


_ARRAY_STARTS = frozenset([*range(0x91, 0xA0), 0xDC, 0xDD])  # msgpack array headers


def _may_start_frame(data: bytes, at: int) -> bool:
    """The cheap tests a frame start passes before its CRC is worth computing: frames
    are < 16 MiB, so the length starts with a zero byte, and every payload is an array."""
    end = at + RECORD_HEADER_BYTES
    return end < len(data) and data[at] == 0 and data[end] in _ARRAY_STARTS


class _Chains:
    """Which offsets start a chain of valid frames that ends exactly at the end of the
    file, each offset decoded at most once."""

    def __init__(self, data: bytes, result: Scan) -> None:
        """``result.candidates`` counts the offsets decoded."""
        self.data = data
        self.result = result
        self.known: dict[int, bool] = {len(data): True}

    def to_end(self, at: int) -> bool:
        path = []
        while at not in self.known:
            if not _may_start_frame(self.data, at):
                self.known[at] = False
                break
            self.result.candidates += 1
            got = _record_at(self.data, at)
            if isinstance(got, str):
                self.known[at] = False
                break
            path.append(at)
            at = got[1]
        verdict = self.known[at]
        for start in path:
            self.known[start] = verdict
        return verdict


def _frames_after(data: bytes, pos: int, result: Scan) -> bool:
    """Whether a valid frame starts anywhere after ``pos``. Frames are < 16 MiB, so a
    frame starts with a zero byte and its payload with an array header: only offsets
    that pass both cheap tests are decoded."""
    end = len(data) - RECORD_HEADER_BYTES
    at = data.find(b"\x00", pos)
    while 0 <= at < end:
        if _may_start_frame(data, at):
            result.candidates += 1
            if not isinstance(_record_at(data, at), str):
                return True
        at = data.find(b"\x00", at + 1)
    return False


def _damage_is_torn_tail(data: bytes, pos: int, result: Scan) -> bool:
    """A frame at ``pos`` failed. Is it the cut-off last write, or damage in the middle?

    The last write is one frame appended at the end, so everything from ``pos`` to the
    end of the file belongs to that frame: when its declared length fits in the file,
    valid frames after its end prove damage in the middle. When it runs past the end,
    the rest of the file is its payload: it is damage in the middle only if valid
    frames chain from inside it to the very end of the file.
    """
    if len(data) - pos < RECORD_HEADER_BYTES:
        return True
    size = int.from_bytes(data[pos : pos + 4], "big")
    declared_end = pos + RECORD_HEADER_BYTES + size
    if 0 < size <= MAX_RECORD_BYTES and declared_end <= len(data):
        return not _frames_after(data, declared_end - 1, result)
    chains = _Chains(data, result)
    at = data.find(b"\x00", pos + 1)
    while 0 <= at < len(data) - RECORD_HEADER_BYTES:
        if chains.to_end(at):
            return False
        at = data.find(b"\x00", at + 1)
    return True


def scan_frames(data: bytes, seq: int) -> Scan:
    """The records of a version 1 file whose header (checked by the caller) says ``seq``."""
    result = Scan(seq=seq, version=VERSION, good_end=HEADER_BYTES, size=len(data))
    pos = HEADER_BYTES
    while pos < len(data):
        got = _record_at(data, pos)
        if isinstance(got, str):
            result.damage = got
            result.damage_at = pos
            result.torn_tail = _damage_is_torn_tail(data, pos, result)
            break
        records, pos = got
        result.records.extend(records)
        result.good_end = pos
    return result
