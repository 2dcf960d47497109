"""Every write of the journal and of snapshots is checked, short writes included.

``os.write`` may write less than it was given without raising (a disk filling part way
through the call); only the next call reports ENOSPC. ``logfile.write_all`` is the one
helper every journal and snapshot write goes through: it writes the rest again and
raises when a call writes nothing. Here a fake ``os.write`` writes at most a few bytes
per call: every file must still come out whole.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rsd.core import Rec
from rsd.disk.datadir import segment_name, snapshot_name
from rsd.disk.journal import Journal
from rsd.disk.logfile import JOURNAL_MAGIC, SNAPSHOT_MAGIC, scan, write_all
from rsd.disk.recovery import Recovery
from rsd.disk.snapshotfile import write_snapshot
from rsproto import Op
from tests.support.core import CoreDriver

REAL_WRITE = os.write
REAL_PWRITE = os.pwrite


def at_most(limit: int, calls: list[int]) -> tuple[object, object]:
    """An ``os.write`` and an ``os.pwrite`` that write at most ``limit`` bytes per call
    (returning the count, as the kernel does on a short write), each call's size kept."""

    def write(fd: int, data: bytes) -> int:
        calls.append(min(limit, len(data)))
        return REAL_WRITE(fd, memoryview(data)[:limit])

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls.append(min(limit, len(data)))
        return REAL_PWRITE(fd, memoryview(data)[:limit], offset)

    return write, pwrite


def test_a_short_write_is_finished_by_writing_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    write, pwrite = at_most(7, calls)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pwrite", pwrite)
    data = bytes(range(256)) * 4
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, data)
        write_all(fd, b"at-offset", 3)  # pwrite: the file position is not used
    finally:
        os.close(fd)
    expected = bytearray(data)
    expected[3:12] = b"at-offset"
    assert path.read_bytes() == bytes(expected)
    assert len(calls) == -(-len(data) // 7) + 2  # each short write resumed where it ended


def test_a_write_that_writes_nothing_raises_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as info:
            write_all(fd, b"something")
    finally:
        os.close(fd)
    assert info.value.errno == errno.ENOSPC and "short write" in str(info.value)


def test_journal_segments_come_out_whole_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    write, pwrite = at_most(5, calls)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pwrite", pwrite)
    journal = Journal(tmp_path, 1, "always")  # its header is written 5 bytes at a time too
    for n in range(20):
        journal.write([(Rec.CLEAN_SHUTDOWN + 1000, n, "x" * n)])
    journal.sync_now()
    journal.close()
    monkeypatch.undo()
    got = scan(tmp_path / segment_name(1), JOURNAL_MAGIC)
    assert got.damage is None
    assert [rec[1] for rec in got.records[:20]] == list(range(20))
    assert calls and max(calls) == 5


def test_a_snapshot_comes_out_whole_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = CoreDriver()
    for n in range(30):
        args = {"scope": "s", "mailbox": "jobs", "key": f"k{n}", "data": "d" * 300}
        core.call(Op.TASK_SUBMIT, args)
    core.drain()
    calls: list[int] = []
    write, pwrite = at_most(1000, calls)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pwrite", pwrite)
    write_snapshot(tmp_path, core, 1, os.getpid())
    monkeypatch.undo()
    snap = scan(tmp_path / snapshot_name(1), SNAPSHOT_MAGIC)
    assert snap.damage is None and snap.records[-1][0] == Rec.SNAPSHOT_END
    rebuilt = core.fresh()
    for rec in Recovery(tmp_path).records():
        rebuilt.apply(rec, 0.0)
    assert rebuilt.work.by_state == core.work.by_state
