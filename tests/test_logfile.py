"""The on-disk framing (rsd/disk/logfile.py, format version 2), without a server.

Round trips of single-record frames and batch frames, and the one distinction recovery
depends on: a file whose last frame was cut short by a crash (a torn tail: nothing valid
after the damage) versus a file damaged in the middle (valid frames follow). The torn
case is checked at every byte offset of the last frame, so no cut position can be
mistaken for mid-file damage or lose a record before it.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from rsd.disk.logfile import (
    FORMAT_VERSION,
    HEADER_BYTES,
    JOURNAL_MAGIC,
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SNAPSHOT_MAGIC,
    FileDamaged,
    encode_batch,
    encode_record,
    file_header,
    scan,
)

SALT = bytes.fromhex("5a17ed0f1e5a17ed")  # the salt of every file these tests write

RECORDS: list[list[Any]] = [
    [1, "scope-a", 1_700_000_000.5],
    [2, "scope-a", "key", 7, 1, "alice", 30.0],
    [11, "t-1", False, "scope-a", "jobs", None, b"\x00" * 16, {"n": 1, "s": "x" * 40}, 1.0, None],
    [3, 7, "released"],
    [14, "t-1", "SUCCEEDED", {"payload": [1, 2, 3]}, None, 2.0, False],
]


# The same records framed as the journal writes them: a batch per write (here a lone
# record, a batch of two, a lone record, a batch of one).
FRAMES: list[Any] = [RECORDS[0], RECORDS[1:3], RECORDS[3], RECORDS[4:]]
FRAME_STARTS = [0, 1, 3, 4]  # index in RECORDS of each frame's first record


def write_file(
    path: Path, records: list[Any], magic: bytes = JOURNAL_MAGIC, seq: int = 5
) -> list[int]:
    """Write one single-record frame per record; the offset of each frame (and the end)."""
    data = bytearray(file_header(magic, seq, SALT))
    offsets = []
    for rec in records:
        offsets.append(len(data))
        data += encode_record(rec, SALT)
    offsets.append(len(data))
    path.write_bytes(bytes(data))
    return offsets


def write_frames(path: Path, frames: list[Any] = FRAMES) -> list[int]:
    """Write records and batches as given; the offset of each frame (and the end)."""
    data = bytearray(file_header(JOURNAL_MAGIC, 1, SALT))
    offsets = []
    for frame in frames:
        offsets.append(len(data))
        data += encode_batch(frame, SALT) if isinstance(frame[0], list) else encode_record(
            frame, SALT
        )
    offsets.append(len(data))
    path.write_bytes(bytes(data))
    return offsets


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS, seq=0x1234)
    got = scan(path, JOURNAL_MAGIC)
    assert got.seq == 0x1234
    assert got.records == RECORDS
    assert got.damage is None and got.damage_at is None and not got.torn_tail
    assert got.good_end == got.size == offsets[-1]
    assert offsets[0] == HEADER_BYTES


def test_snapshot_magic_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    write_file(path, RECORDS, magic=SNAPSHOT_MAGIC)
    assert scan(path, SNAPSHOT_MAGIC).records == RECORDS
    with pytest.raises(FileDamaged):
        scan(path, JOURNAL_MAGIC)  # a snapshot is not a journal segment


def test_empty_file_after_header(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    write_file(path, [])
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == [] and got.damage is None and got.good_end == HEADER_BYTES


def test_record_framing_is_salt_length_crc_payload() -> None:
    data = encode_record([3, 9, "expired"], SALT)
    salt, size, crc = struct.unpack(">8sII", data[:16])
    assert RECORD_HEADER_BYTES == 16
    assert salt == SALT
    assert size == len(data) - 16
    assert crc == zlib.crc32(SALT + data[8:12] + data[16:])


def test_cut_at_every_offset_of_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    full = path.read_bytes()
    last_start = offsets[-2]
    for cut in range(last_start + 1, len(full)):
        path.write_bytes(full[:cut])
        got = scan(path, JOURNAL_MAGIC)
        assert got.records == RECORDS[:-1], cut
        assert got.damage is not None, cut
        assert got.torn_tail, cut
        assert got.damage_at == last_start, cut
        assert got.good_end == last_start, cut
    path.write_bytes(full[:last_start])  # cut exactly between records: nothing is damaged
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[:-1] and got.damage is None and not got.torn_tail


@pytest.mark.parametrize(
    "garbage",
    [b"\x00", b"\x00" * 7, b"\x00" * 64, b"\xff" * 3, b"\xff" * 100, b"garbage after the end"],
)
def test_garbage_after_valid_records_is_a_torn_tail(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    with open(path, "ab") as f:
        f.write(garbage)
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS
    assert got.torn_tail
    assert got.damage_at == offsets[-1] == got.good_end


def test_zero_filled_preallocated_tail_is_a_torn_tail(tmp_path: Path) -> None:
    """What some file systems leave after a crash: the size grew, the data did not land."""
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    with open(path, "ab") as f:
        f.write(b"\x00" * 4096)
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS and got.torn_tail and got.damage_at == offsets[-1]


@pytest.mark.parametrize("victim", [1, 2, 3])
def test_bit_flip_in_a_middle_record_is_damage(tmp_path: Path, victim: int) -> None:
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    data = bytearray(path.read_bytes())
    start, end = offsets[victim], offsets[victim + 1]
    for pos in (start + 17, (start + end) // 2, end - 1):  # inside the payload
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        path.write_bytes(bytes(flipped))
        got = scan(path, JOURNAL_MAGIC)
        assert got.records == RECORDS[:victim], pos
        assert got.damage is not None, pos
        assert not got.torn_tail, pos
        assert got.damage_at == start, pos
        assert got.good_end == start, pos


def test_bit_flip_in_a_middle_record_header_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    for pos in (offsets[2] + 1, offsets[2] + 9, offsets[2] + 13):  # salt, length, CRC
        data = bytearray(path.read_bytes())
        data[pos] ^= 0x01
        broken = tmp_path / f"broken-{pos}.log"
        broken.write_bytes(bytes(data))
        got = scan(broken, JOURNAL_MAGIC)
        assert got.records == RECORDS[:2]
        assert not got.torn_tail and got.damage_at == offsets[2]


def test_bit_flip_in_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    """Indistinguishable from a torn write of the last record: nothing valid follows."""
    path = tmp_path / "journal.log"
    offsets = write_file(path, RECORDS)
    data = bytearray(path.read_bytes())
    data[offsets[-2] + 10] ^= 0x40
    path.write_bytes(bytes(data))
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[:-1] and got.torn_tail and got.damage_at == offsets[-2]


def test_batch_frames_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    offsets = write_frames(path)
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS
    assert got.damage is None and got.good_end == offsets[-1]


def test_a_batch_frame_is_whole_or_torn(tmp_path: Path) -> None:
    """The last write is one batch: a cut anywhere in it drops all of it, nothing before."""
    path = tmp_path / "journal.log"
    offsets = write_frames(path, [*FRAMES, RECORDS])
    full = path.read_bytes()
    for cut in range(offsets[-2] + 1, len(full)):
        path.write_bytes(full[:cut])
        got = scan(path, JOURNAL_MAGIC)
        assert got.records == RECORDS, cut
        assert got.torn_tail and got.damage_at == offsets[-2] == got.good_end, cut


@pytest.mark.parametrize("victim", [1, 2])
def test_bit_flip_in_a_middle_batch_is_damage(tmp_path: Path, victim: int) -> None:
    path = tmp_path / "journal.log"
    offsets = write_frames(path)
    data = bytearray(path.read_bytes())
    data[(offsets[victim] + offsets[victim + 1]) // 2] ^= 0x04
    path.write_bytes(bytes(data))
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[: FRAME_STARTS[victim]]
    assert not got.torn_tail and got.damage_at == offsets[victim]


def test_a_batch_holding_an_untyped_record_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    data = file_header(JOURNAL_MAGIC, 1, SALT) + encode_record(RECORDS[0], SALT)
    bad_at = len(data)
    data += encode_batch([RECORDS[1], ["not", "typed"]], SALT) + encode_record(RECORDS[2], SALT)
    path.write_bytes(data)
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[:1] and got.damage_at == bad_at and not got.torn_tail


def test_a_frame_over_the_length_limit_is_damage(tmp_path: Path) -> None:
    """The reader trusts no frame longer than MAX_RECORD_BYTES, so no writer may make
    one (test_durability.py checks the writers: large snapshots and bursts of submits)."""
    path = tmp_path / "journal.log"
    data = file_header(JOURNAL_MAGIC, 1, SALT) + encode_record(RECORDS[0], SALT)
    big_at = len(data)
    data += struct.pack(">8sII", SALT, MAX_RECORD_BYTES + 1, 0) + b"\x00" * 100  # a header
    path.write_bytes(data + encode_record(RECORDS[1], SALT))
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[:1] and got.damage_at == big_at
    assert got.damage is not None and "length" in got.damage and not got.torn_tail


def test_header_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    write_file(path, RECORDS)
    full = path.read_bytes()
    for cut in range(HEADER_BYTES):
        path.write_bytes(full[:cut])
        with pytest.raises(FileDamaged, match="cut short"):
            scan(path, JOURNAL_MAGIC)


def test_header_damage(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    write_file(path, RECORDS)
    full = path.read_bytes()
    for pos in range(HEADER_BYTES):
        data = bytearray(full)
        data[pos] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(FileDamaged) as info:
            scan(path, JOURNAL_MAGIC)
        assert str(path) in str(info.value)


def test_wrong_magic(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    head = struct.pack(">4sHHQ8s", b"NOPE", FORMAT_VERSION, 0, 1, SALT)
    header = head + struct.pack(">I", zlib.crc32(head))
    path.write_bytes(header + encode_record([1, "s", 0.0], SALT))
    with pytest.raises(FileDamaged, match="not an rsd"):
        scan(path, JOURNAL_MAGIC)


def test_wrong_version(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    head = struct.pack(">4sHHQ8s", JOURNAL_MAGIC, FORMAT_VERSION + 1, 0, 1, SALT)
    header = head + struct.pack(">I", zlib.crc32(head))
    path.write_bytes(header + encode_record([1, "s", 0.0], SALT))
    with pytest.raises(FileDamaged, match=f"format version {FORMAT_VERSION + 1}"):
        scan(path, JOURNAL_MAGIC)


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", b"\x93\x01\x02"[:2], b"\xa3abc", b"\x90", b"\x91\xa1x"],
    ids=["invalid-msgpack", "truncated-array", "not-an-array", "empty-array", "untyped"],
)
def test_record_with_valid_crc_but_bad_content_is_damage(tmp_path: Path, payload: bytes) -> None:
    """A CRC only proves the bytes are what was written: content is checked too."""
    path = tmp_path / "journal.log"
    size = struct.pack(">I", len(payload))
    bad = SALT + size + struct.pack(">I", zlib.crc32(SALT + size + payload)) + payload
    data = file_header(JOURNAL_MAGIC, 1, SALT) + encode_record(RECORDS[0], SALT) + bad
    data += encode_record(RECORDS[1], SALT)
    path.write_bytes(data)
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS[:1]
    assert not got.torn_tail
    assert got.damage_at == HEADER_BYTES + len(encode_record(RECORDS[0], SALT))


def test_cut_record_whose_data_embeds_a_framed_record_is_still_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Task data is arbitrary client bytes: it may contain anything, a frame included.
    A crash that cuts such a record must still read as a torn tail, or rsd refuses to
    start after an ordinary crash."""
    path = tmp_path / "journal.log"
    inner = encode_record([1, "x", 0.0], bytes(8))  # a client never knows the file's salt
    last = [11, "t-2", False, "s", "jobs", None, None, b"abc" + inner + b"tail" * 10, 1.0, None]
    offsets = write_file(path, [*RECORDS, last])
    full = path.read_bytes()
    path.write_bytes(full[:-5])
    got = scan(path, JOURNAL_MAGIC)
    assert got.records == RECORDS
    assert got.torn_tail
    assert got.damage_at == offsets[-2]
