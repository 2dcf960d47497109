"""A write that never reached the disk, inside the zeros written ahead, ends the log.

The journal preallocates its open segment with zeros (journal.py), so its writes land in
blocks that already exist and the kernel may put them on disk in any order: a power loss
during an fdatasync can keep a later frame's page and lose an earlier one's, leaving
zeros where a frame starts and valid frames after them. No fdatasync covering the later
frames ever finished (one that finished would have covered the earlier frame too), so
none of them was acknowledged under ``--fsync always``: the last segment's log ends at
the zeros, with a warning naming them, and rsd starts. Only the last segment: every
earlier one was fsynced whole before the next was made, so zeros inside it are damage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rsd.core import Rec
from rsd.disk.datadir import segment_name
from rsd.disk.logfile import JOURNAL_MAGIC, encode_batch, file_header, scan
from rsd.disk.recovery import Recovery, RecoveryError

SALT = bytes.fromhex("5a17ed0f1e5a17ed")
PAGE = 4096


def batch(n: int, pad: int) -> list[tuple[object, ...]]:
    return [(Rec.CLEAN_SHUTDOWN + 1000, n, "x" * pad)]  # the framing only: any typed record


def lost_page_segment(path: Path, seq: int) -> list[int]:
    """Frames 0..3; the page holding frame 2's start never written (zeros from there to
    the page's end), frame 2's later pages and frame 3 on disk. Each frame's offset."""
    data = bytearray(file_header(JOURNAL_MAGIC, seq, SALT))
    offsets = []
    for n, pad in enumerate((100, 1500, 9000, 300)):
        offsets.append(len(data))
        data += encode_batch(batch(n, pad), SALT)
    start = offsets[2]
    end = (start // PAGE + 1) * PAGE
    data[start:end] = bytes(end - start)
    path.write_bytes(bytes(data + bytes(3 * PAGE)))  # the zeros ahead, after the frames
    return offsets


def test_zeros_where_a_frame_starts_are_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    offsets = lost_page_segment(path, 1)
    got = scan(path, JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == [0, 1]
    assert got.torn_tail and not got.zero_tail
    assert got.damage_at == got.good_end == offsets[2]


def test_recovery_ends_the_last_segment_at_a_lost_write_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / segment_name(1)
    offsets = lost_page_segment(path, 1)
    recovery = Recovery(tmp_path)
    assert [rec[1] for rec in recovery.records()] == [0, 1]
    assert recovery.report.truncated is not None and str(offsets[2]) in recovery.report.truncated
    assert "torn tail" in caplog.text
    recovery.mend()
    assert path.stat().st_size == offsets[2]


def test_zeros_where_a_frame_starts_in_an_earlier_segment_are_still_damage(
    tmp_path: Path,
) -> None:
    lost_page_segment(tmp_path / segment_name(1), 1)
    last = bytearray(file_header(JOURNAL_MAGIC, 2, SALT)) + encode_batch(batch(9, 0), SALT)
    (tmp_path / segment_name(2)).write_bytes(bytes(last))
    with pytest.raises(RecoveryError, match="refusing to start"):
        list(Recovery(tmp_path).records())


def test_zeros_shorter_than_a_sector_where_a_frame_starts_are_damage(tmp_path: Path) -> None:
    """Not the shape of a lost write (a whole sector at least): the file was damaged."""
    path = tmp_path / "journal.log"
    data = bytearray(file_header(JOURNAL_MAGIC, 1, SALT))
    offsets = []
    for n in range(3):
        offsets.append(len(data))
        data += encode_batch(batch(n, 1000), SALT)
    data[offsets[1]:offsets[1] + 16] = bytes(16)
    path.write_bytes(bytes(data))
    got = scan(path, JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == [0] and not got.torn_tail


def test_a_lost_page_inside_a_frame_is_a_torn_tail(tmp_path: Path) -> None:
    """The frame's first page reached the disk, a later one did not, the next frame did."""
    path = tmp_path / "journal.log"
    data = bytearray(file_header(JOURNAL_MAGIC, 1, SALT))
    offsets = []
    for n, pad in enumerate((100, 3 * PAGE, 300)):
        offsets.append(len(data))
        data += encode_batch(batch(n, pad), SALT)
    lost = (offsets[1] // PAGE + 1) * PAGE
    data[lost:lost + PAGE] = bytes(PAGE)
    path.write_bytes(bytes(data))
    got = scan(path, JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == [0]
    assert got.torn_tail and got.damage_at == offsets[1]
