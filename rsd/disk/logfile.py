"""The on-disk framing shared by journal segments and snapshots: format version 14.

A file starts with a 28-byte header: magic (4 bytes, ``RSDJ`` for a journal segment,
``RSDS`` for a snapshot), format version (u16, 4), flags (u16, 0), sequence number
(u64), the file's salt (8 bytes) and the CRC-32 of those 24 bytes (u32), all
big-endian. Frames follow back to back, each the file's salt (8 bytes), the payload
length (u32), the CRC-32 of salt, length and payload together (u32), and the payload:
one msgpack array, either one record (an array whose first element is its integer
type) or a batch of records (an array of such arrays). The journal writes one batch
frame per write, so a batch is the unit that is whole or torn, and decoding it is one
msgpack call. Records are encoded and decoded by the wire's codec (rsproto: msgspec,
the bytes msgpack-python wrote, and msgpack-python for a payload that may hold a
timestamp), so a file written before either way reads the same.

What always holds:
- every file gets a salt of its own, drawn from ``os.urandom`` when it is created
  (the snapshot child draws its own), and the salt never leaves the disk: no client
  ever sees it. So bytes a client stored (task data may be anything, frames included)
  can never pass for a frame: a forgery would have to start with the 8 salt bytes and
  carry a CRC seeded with them (SQLite's WAL salts its frames for the same reason);
- a reader that meets a frame it cannot trust tells a torn tail (no valid frame
  follows: a crash cut the last write) from damage in the middle (a valid frame
  follows: the file was corrupted), because the two call for different actions. The
  frames after the damage are looked for with ``bytes.find`` of the salt, and each
  offset it finds is checked once, so the scan is linear in the file's size whatever
  the payloads hold;
- versions 2, 3 and 4 share this framing; version 3 changed what records hold (tenants,
  lease handles: core/records.py), and the records of older files are brought to
  today's layouts by core/upgrade.py as recovery reads them; version 4 added one
  record, SNAP_QUEUED (many queued items in one record: core/items.py), so a version 3
  file holds version 4's records but that one, and an rsd that reads only up to
  version 3 refuses a version 4 file by its header, naming the version; version 5
  made an item's needs fields of ITEM_ENQUEUED and SNAP_ITEM (ITEM_ENQUEUED_NEEDS and
  SNAP_ITEM_NEEDS before) and added the measured payload sizes to ITEM_ENQUEUED and
  FINISHED; version 6 added one record, STREAM_AT (a cluster node's place in its
  primary's stream: core/streamat.py); version 7 added ITEM_DUE (a DELAYED item
  became PENDING, or a retry's backoff ended) and an item's not_before, priority and
  fairness_key to ITEM_ENQUEUED, SNAP_ITEM and (priority, fairness_key) SNAP_QUEUED
  (lanes.py), whether a lease ends with its connection to the grants and their snapshot
  records, and the records of schedules (SCHEDULE_ENSURED, SCHEDULE_FIRED,
  SCHEDULE_PAUSED, SCHEDULE_DELETED, SNAP_SCHEDULE: core/schedulebook.py); version 8
  added one record, DEAD_LETTER_DELETED (an operator deleted a dead letter:
  core/deadletters.py); version 9 a field of SNAP_COUNTERS (the last jump's floor);
  version 10 two records, RUNS_IMPORTED and RUNS_DROPPED (runs moved between shards:
  core/transfer.py) and SNAP_FORWARDED; version 11 three, GRANT_HELD, GRANT_ENDED and
  SNAP_GRANT (capacity a task holds from another shard: core/work/grants.py);
  version 12 one, MAILBOX_PAUSED (a mailbox paused or resumed: core/work/pauses.py);
  version 13 TASK_PROGRESSED, TASK_FOLLOWED and SNAP_TASK_EVENTS (a task's retained
  events: core/work/progress.py), SUSPENDED, SIGNALLED, WAIT_TIMED_OUT and SNAP_SIGNALS (a task
  that waits for a signal: core/work/waiting.py); version 14 ITEM_ENQUEUED's links
  fields, SNAP_LINKS and TASK_UNBLOCKED (a task's parents and children:
  core/work/parents.py), ITEM_LIMITED, RATE_PERIOD_BEGUN and SNAP_KEY_GATE (limits by
  key: core/work/keylimits.py);
  every record kind, field and the version it appeared in is declared in
  core/records.py, whose ``FORMAT_VERSION`` this is;
- nothing but zeros after the last frame is a torn tail marked ``zero_tail``: the end
  of a segment the journal preallocated (journal.py), or a file system's zeros after a
  crash grew the file but lost its data; no frame starts with zeros (it starts with the
  file's random salt), so no record can hide there;
- a damaged frame holding zeros where a write never reached the disk (from its start to
  the end of that sector, or a whole sector inside it), with frames after it, is a torn
  tail too. The journal writes into
  zeros it preallocated, whose pages the kernel may put on disk in any order, so a
  power loss during an fdatasync can keep a later frame and lose an earlier one; no
  fdatasync covering the later frames finished (it would have covered the earlier one),
  so none of them was acknowledged under ``--fsync always``. Recovery cuts the last
  segment there (with a warning) and still refuses such zeros in an earlier segment,
  which was fsynced whole before the next one was made;
- files of format version 1 (no salt) are still read (logfile_v1.py); only version 14
  is written.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsproto import pack_from_rsd, unpack_from_rsd

from ..core.records import FORMAT_VERSION

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "JOURNAL_MAGIC",
    "MAX_RECORD_BYTES",
    "RECORD_HEADER_BYTES",
    "SALT_BYTES",
    "SNAPSHOT_MAGIC",
    "FileDamaged",
    "HeaderCutShort",
    "Scan",
    "encode_batch",
    "encode_record",
    "file_header",
    "frames",
    "fsync_dir",
    "new_salt",
    "read_back",
    "records_of",
    "scan",
    "write_all",
]

JOURNAL_MAGIC = b"RSDJ"
SNAPSHOT_MAGIC = b"RSDS"
READS_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, FORMAT_VERSION)
MAX_RECORD_BYTES = 8 << 20
SALT_BYTES = 8

_HEADER = struct.Struct(">4sHHQ8s")
_RECORD = struct.Struct(">8sII")
HEADER_BYTES = _HEADER.size + 4
RECORD_HEADER_BYTES = _RECORD.size
_V1_HEADER_BYTES = 20  # logfile_v1.HEADER_BYTES, known here to tell a cut-short header


class FileDamaged(Exception):
    """A file whose header is unreadable or of an unknown format or version."""


class HeaderCutShort(FileDamaged):
    """A file shorter than its header: a crash while the file was being created."""


def new_salt() -> bytes:
    """A salt for a new file: random, so no client can know it."""
    return os.urandom(SALT_BYTES)


def file_header(magic: bytes, seq: int, salt: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A file's header. ``version`` other than FORMAT_VERSION: for tests of old files."""
    head = _HEADER.pack(magic, version, 0, seq, salt)
    return head + struct.pack(">I", zlib.crc32(head))


def _frame(payload: bytes, salt: bytes) -> bytes:
    size = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(salt + size.to_bytes(4, "big")))
    return _RECORD.pack(salt, size, crc) + payload


def encode_record(rec: Any, salt: bytes) -> bytes:
    """A frame holding one record, for the file whose salt is ``salt``."""
    return _frame(pack_from_rsd(rec), salt)


FRAME_TARGET_BYTES = 1 << 20  # batches are split into frames of about this size at most


def encode_batch(records: list[Any], salt: bytes) -> bytes:
    """Frames holding a batch of records (the journal's unit of writing), each well
    under MAX_RECORD_BYTES: a large batch is split in halves until each part fits.

    ``salt`` is the salt of the file the frames go to: required, so that no writer can
    produce frames that belong to no file. Raises what ``rsproto.pack_from_rsd`` raises for
    a value it cannot encode (``rsproto.ENCODE_ERRORS``).
    """
    payload = pack_from_rsd(records)
    if len(payload) > FRAME_TARGET_BYTES and len(records) > 1:
        half = len(records) // 2
        return encode_batch(records[:half], salt) + encode_batch(records[half:], salt)
    return _frame(payload, salt)


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write every byte of ``data`` to ``fd`` (at ``offset`` with pwrite, else at the
    file position), or raise OSError: the one way the journal and snapshots write.

    A write may be short without raising: when the disk fills part way, the kernel
    writes what fits and returns the count; only the next call reports ENOSPC. So the
    rest is written again until none is left, and a call that writes nothing raises
    ENOSPC itself (no progress is never success). A caller can then trust that a
    return means every byte reached the file (the page cache: fsync is the caller's).
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(
                errno.ENOSPC, f"short write: no byte written of {len(view)} (disk full?)"
            )
        view = view[written:]
        if offset is not None:
            offset += written


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
    version: int = FORMAT_VERSION
    records: list[Any] = field(default_factory=list)
    good_end: int = HEADER_BYTES
    size: int = 0
    damage: str | None = None  # why reading stopped before the end, or None
    damage_at: int | None = None  # the offset of the first record not trusted
    torn_tail: bool = False  # nothing valid after the damage: a cut-off last write
    candidates: int = 0  # offsets after the damage checked as frame starts (the scan's cost)
    zero_tail: bool = False  # a torn tail of zeros only: preallocated, the end of the log


def records_of(payload: memoryview | bytes) -> list[Any] | str:
    """The records a frame's payload holds (whose CRC matched), or why there are none:
    a CRC only proves the bytes are what was written, so the content is checked too."""
    try:
        value = unpack_from_rsd(payload)
    except Exception as exc:
        return f"undecodable record ({exc})"
    if type(value) is not list or not value:
        return "frame is not a record or a batch"
    if type(value[0]) is int:
        return [value]
    for rec in value:
        if type(rec) is not list or not rec or type(rec[0]) is not int:
            return "batch holds something that is not a typed record"
    return value


def _record_at(data: bytes, pos: int, salt: bytes) -> tuple[list[Any], int] | str:
    """The records of the frame at ``pos`` and the offset after it, or why there are none."""
    if len(data) - pos < RECORD_HEADER_BYTES:
        return "record header cut short"
    marker, size, crc = _RECORD.unpack_from(data, pos)
    if marker != salt:
        return "no frame of this file starts here (salt mismatch)"
    if size == 0 or size > MAX_RECORD_BYTES:
        return f"implausible record length {size}"
    start = pos + RECORD_HEADER_BYTES
    end = start + size
    if end > len(data):
        return "record cut short"
    payload = memoryview(data)[start:end]
    if zlib.crc32(payload, zlib.crc32(data[pos : pos + 12])) != crc:
        return "CRC mismatch"
    records = records_of(payload)
    if isinstance(records, str):
        return records
    return records, end


def _frame_after(data: bytes, pos: int, salt: bytes, result: Scan) -> bool:
    """Whether a valid frame starts anywhere after ``pos``. Only offsets holding the
    salt can start one; ``find`` runs at C speed and each offset is checked once."""
    at = data.find(salt, pos + 1)
    while at >= 0:
        result.candidates += 1
        if not isinstance(_record_at(data, at, salt), str):
            return True
        at = data.find(salt, at + 1)
    return False


def _header(path: Path, data: bytes, magic: bytes) -> tuple[int, int, bytes]:
    """The version, seq and salt (empty for version 1) of a file. Raises FileDamaged."""
    known = len(data) >= 6 and data[:4] == magic
    version = int.from_bytes(data[4:6], "big") if known else FORMAT_VERSION
    need = _V1_HEADER_BYTES if version == 1 else HEADER_BYTES
    if len(data) < need:
        raise HeaderCutShort(f"{path}: file header cut short ({len(data)} bytes)")
    if not known:
        raise FileDamaged(f"{path}: not an rsd {magic.decode()} file, or its header is damaged")
    if version not in READS_VERSIONS:
        raise FileDamaged(
            f"{path}: format version {version}; this rsd reads versions "
            f"{', '.join(map(str, READS_VERSIONS))} (or the header is damaged)"
        )
    (crc,) = struct.unpack_from(">I", data, need - 4)
    if zlib.crc32(data[: need - 4]) != crc:
        raise FileDamaged(f"{path}: not an rsd {magic.decode()} file, or its header is damaged")
    seq = int.from_bytes(data[8:16], "big")
    return version, seq, data[16:24] if version >= 2 else b""


def frames(path: Path, magic: bytes) -> tuple[Scan, Iterator[list[Any]]]:
    """The file's ``Scan`` (records left empty) and an iterator over its frames' records,
    one list per frame, in file order: recovery applies each frame while the next is
    still undecoded, so the decoded records of the whole file never exist at once.
    ``good_end``, ``damage`` and the rest of the Scan are final once the iterator is
    exhausted. Raises FileDamaged on a bad header (HeaderCutShort when the file is shorter
    than its header), at once."""
    data = path.read_bytes()
    version, seq, salt = _header(path, data, magic)
    if version == 1:
        from . import logfile_v1  # imported here: it builds on this module

        old = logfile_v1.scan_frames(data, seq)
        records, old.records = old.records, []
        return old, iter([records] if records else [])
    result = Scan(seq=seq, version=version, size=len(data))
    return result, _frames(data, salt, result)


def _frames(data: bytes, salt: bytes, result: Scan) -> Iterator[list[Any]]:
    pos = HEADER_BYTES
    while pos < len(data):
        got = _record_at(data, pos, salt)
        if isinstance(got, str):
            result.damage_at = pos
            if data.count(0, pos) == len(data) - pos:
                result.damage = "zeros after the last frame"
                result.torn_tail = result.zero_tail = True
                return
            if _lost_write_at(data, pos, salt):
                result.damage = "zeros in a frame: a write that never reached the disk"
                result.torn_tail = True
                return
            result.damage = got
            result.torn_tail = not _frame_after(data, pos, salt, result)
            return
        records, pos = got
        result.good_end = pos
        yield records


_SECTOR = 512  # the least a write that never reached the disk leaves unwritten


def _lost_write_at(data: bytes, pos: int, salt: bytes) -> bool:
    """Whether the damaged frame at ``pos`` has the shape of a write that never reached
    the disk (``_frames``): zeros from ``pos`` to the end of its sector (and at least a
    salt's length), or a frame that starts with the salt and a plausible length whose
    span holds a whole sector of zeros (a later page of it lost, an earlier one kept)."""
    end = max(pos + SALT_BYTES, (pos // _SECTOR + 1) * _SECTOR)
    if end <= len(data) and data.count(0, pos, end) == end - pos:
        return True
    if len(data) - pos < RECORD_HEADER_BYTES:
        return False
    marker, size, _ = _RECORD.unpack_from(data, pos)
    if marker != salt or size == 0 or size > MAX_RECORD_BYTES:
        return False
    stop = min(len(data), pos + RECORD_HEADER_BYTES + size)
    sector = (pos // _SECTOR + 1) * _SECTOR
    while sector + _SECTOR <= stop:
        if data.count(0, sector, sector + _SECTOR) == _SECTOR:
            return True
        sector += _SECTOR
    return False


def read_back(path: Path, magic: bytes) -> tuple[int, Iterator[list[Any]]]:
    """The seq of a file just written in today's format, and an iterator over its
    frames' records read one frame at a time (memory: one frame, never the file).

    For checking a file before it is used (snapshots.py), so nothing less than whole is
    accepted: no torn tail, no zeros, every frame's salt, length and CRC checked as
    recovery checks them (``_record_at``). Raises FileDamaged naming the first offset
    that is not a valid frame, at once for the header, else while iterating."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    version, seq, salt = _header(path, head, magic)
    if version != FORMAT_VERSION:
        raise FileDamaged(f"{path}: written as version {version}, not {FORMAT_VERSION}")
    return seq, _read_frames(path, salt)


def _read_frames(path: Path, salt: bytes) -> Iterator[list[Any]]:
    with open(path, "rb") as f:
        pos = f.seek(HEADER_BYTES)
        while top := f.read(RECORD_HEADER_BYTES):
            size = _RECORD.unpack(top)[1] if len(top) == RECORD_HEADER_BYTES else 0
            frame = top + f.read(min(size, MAX_RECORD_BYTES))
            got = _record_at(frame, 0, salt)
            if isinstance(got, str):
                raise FileDamaged(f"{path} at offset {pos}: {got}")
            records, end = got
            pos += end
            yield records


def scan(path: Path, magic: bytes) -> Scan:
    """Read every record of a segment or snapshot file into ``Scan.records``. Raises
    FileDamaged on a bad header (HeaderCutShort when the file is shorter than its
    header)."""
    result, batches = frames(path, magic)
    for records in batches:
        result.records.extend(records)
    return result
