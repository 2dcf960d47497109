"""BACKUP_BEGIN's pin (rsd/disk/backups.py), without a server: the newest snapshot and
the segments after it, the open segment up to its last whole batch at that moment;
reads of them give those bytes, also after a snapshot deleted the files and the journal
went on; what is read back passes ``check_copy``, and a copy cut short does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsd.core import Core, CoreError, Rec
from rsd.core.records import CleanShutdown
from rsd.disk.backups import Backups, check_copy
from rsd.disk.journal import Journal
from rsd.disk.snapshots import Snapshots
from rsd.policy import Policy
from rsproto import ErrorCode


def _read_all(backups: Backups, conn: int, name: str) -> bytes:
    data, offset = b"", 0
    while chunk := backups.read(conn, True, {"file": name, "offset": offset})["data"]:
        assert len(chunk) <= Policy.BACKUP_CHUNK_BYTES
        data += chunk
        offset += len(chunk)
    return data


def test_pinned_files_keep_their_bytes_after_a_snapshot_deletes_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    core = Core(lambda: "s")
    journal = Journal(data, 1)
    snapshots = Snapshots(journal, core, snapshot_bytes=1 << 30)
    pid = snapshots.start()  # snapshot-1, the journal on segment 2
    _, status = os.waitpid(pid, 0)
    snapshots.finished(status)
    for n in range(20):  # more than a chunk
        journal.write([CleanShutdown(Rec.CLEAN_SHUTDOWN, n + i / 3) for i in range(2000)])
    backups = Backups(journal)
    pinned = backups.begin(7, admin=True)
    names = [f["name"] for f in pinned["files"]]
    assert pinned["covers"] == 1
    assert names == ["snapshot-0000000000000001.snap", "journal-0000000000000002.log"]
    segment = pinned["files"][1]
    assert segment["length"] == journal.records_end > Policy.BACKUP_CHUNK_BYTES
    expected = {name: (data / name).read_bytes()[:f["length"]]
                for name, f in zip(names, pinned["files"], strict=True)}
    journal.write([CleanShutdown(Rec.CLEAN_SHUTDOWN, 1e9)])  # after the pin: not in it
    pid = snapshots.start()  # snapshot-2 deletes both pinned files
    _, status = os.waitpid(pid, 0)
    snapshots.finished(status)
    assert not any((data / name).exists() for name in names)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in names:
        got = _read_all(backups, 7, name)
        assert got == expected[name]
        (copy / name).write_bytes(got)
    assert check_copy(copy, 1) is None
    assert backups.end(7, admin=True) == {"ended": True}
    with pytest.raises(CoreError) as refused:
        backups.read(7, True, {"file": names[0], "offset": 0})
    assert refused.value.code == ErrorCode.NOT_FOUND
    # A copy cut short inside a frame, or missing its snapshot, is refused.
    last = copy / names[1]
    last.write_bytes(expected[names[1]][:-5])
    assert "cut short" in (check_copy(copy, 1) or "")
    (copy / names[0]).unlink()
    assert "snapshot" in (check_copy(copy, 1) or "")
    journal.close()


def test_a_client_role_and_a_third_backup_are_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1)
    backups = Backups(journal)
    with pytest.raises(CoreError) as refused:
        backups.begin(1, admin=False)
    assert refused.value.code == ErrorCode.PERMISSION_DENIED
    for conn in range(Policy.MAX_BACKUPS):
        backups.begin(conn, admin=True)
    backups.begin(0, admin=True)  # a second on one connection replaces its first
    with pytest.raises(CoreError) as refused:
        backups.begin(99, admin=True)
    assert refused.value.code == ErrorCode.RESOURCE_EXHAUSTED
    backups.forget(0)  # its connection closed
    backups.begin(99, admin=True)
    backups.close()
    assert backups.pinned == {}
    journal.close()
