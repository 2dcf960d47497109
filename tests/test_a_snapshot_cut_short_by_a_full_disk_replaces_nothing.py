"""A snapshot that a full disk cuts short replaces nothing, and is retried with backoff.

On a disk that fills while the snapshot writer writes, the kernel writes what fits and
returns the count (a short write, no error); the next write raises ENOSPC. Such a file
must never be renamed into place nor any segment deleted: the writer's temporary file
is removed (its space is what the journal needs next), the journal stays whole, and
every task acknowledged before still comes back at the next start. The next snapshot
due by size waits a backoff that grows with each failure in a row (capped); a
SNAPSHOT_NOW request still starts one at once.

The disk here is a fake ``os.write`` over the snapshot's temporary file with a fixed
number of bytes free, in the forked writer (it inherits the patch): the same core's
snapshot is written once elsewhere first, so the free space is set to end inside the
writer's very last write. tests/test_a_full_disk_mid_snapshot_loses_nothing.py does it
on a real small file system.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from rsd.disk.datadir import snapshot_name
from rsd.disk.journal import Journal
from rsd.disk.recovery import Recovery
from rsd.disk.snapshotfile import SnapshotUnverified, write_snapshot
from rsd.disk.snapshots import Snapshots
from rsd.policy import Policy
from rsproto import ErrorCode, Kind, Op
from tests.support.core import HOLDERS, CoreDriver

REAL_WRITE = os.write


class FullDisk:
    """``os.write`` on a disk with ``free`` bytes left for snapshot files: a write that
    does not fit writes what does and returns that count; once full, ENOSPC."""

    def __init__(self, free: int) -> None:
        self.free = free

    def write(self, fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".snap.tmp"):
            return REAL_WRITE(fd, data)
        if self.free == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = REAL_WRITE(fd, memoryview(data)[: self.free])
        self.free -= written
        return written


def submit(core: CoreDriver, journal: Journal, prefix: str, count: int) -> list[str]:
    """Submit ``count`` tasks and journal their records (fsynced: acknowledged)."""
    ids = []
    for n in range(count):
        args = {"scope": "s", "mailbox": "jobs", "key": f"{prefix}{n}", "data": "d" * 500}
        ids.append(core.call(Op.TASK_SUBMIT, args)["id"])
    before = len(core.records)
    core.drain()
    journal.write(core.records[before:])
    journal.sync_now()
    return ids


def run_writer(snapshots: Snapshots) -> None:
    pid = snapshots.start()
    _, status = os.waitpid(pid, 0)
    snapshots.finished(status)


def test_a_snapshot_the_disk_cuts_short_replaces_nothing_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    core = CoreDriver()
    journal = Journal(data, 1, "always")
    journal.write(core.records)  # the runs and mailboxes made at setup
    snapshots = Snapshots(journal, core, snapshot_bytes=4096)
    acknowledged = submit(core, journal, "a", 40)
    run_writer(snapshots)  # a snapshot written as usual: the journal moves past it
    acknowledged += submit(core, journal, "b", 40)  # in the journal only
    (tmp_path / "dry").mkdir()
    write_snapshot(tmp_path / "dry", core, 2, os.getpid())  # what the next one will hold
    size = (tmp_path / "dry" / snapshot_name(2)).stat().st_size
    before = sorted(os.listdir(data))

    disk = FullDisk(free=size - 10)  # the disk fills 10 bytes before the last write ends
    monkeypatch.setattr(os, "write", disk.write)
    snapshots.ask(1, 77)
    assert snapshots.due()
    run_writer(snapshots)
    monkeypatch.undo()

    after = sorted(os.listdir(data))
    assert not [name for name in after if name.endswith(".tmp")]  # its space is free again
    assert [name for name in after if name.endswith(".snap")] == [snapshot_name(1)]
    assert set(before) <= set(after)  # no segment deleted (one more: the rotation's)
    [(conn, frame)] = core.effects.take_messages()
    assert conn == 1 and frame[:3] == [Kind.ERROR, 77, ErrorCode.INTERNAL]
    assert snapshots.stats["snapshot_failures"] == 1
    journal.close()

    rebuilt = core.fresh(HOLDERS)
    recovery = Recovery(data)
    for rec in recovery.records():
        rebuilt.apply(rec, core.now)
    assert recovery.report.snapshot == snapshot_name(1) and recovery.report.clean
    for task in acknowledged:
        assert rebuilt.call(Op.TASK_STATUS, {"scope": "s", "task": task})["id"] == task
    assert rebuilt.work.by_state == core.work.by_state


def test_a_snapshot_that_does_not_read_back_whole_is_never_put_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write reports success but one byte reaches the file wrong (a bad disk or
    controller): the read-back check (every frame's CRC, the record count) refuses it."""
    core = CoreDriver()
    (tmp_path / "journal").mkdir()
    journal = Journal(tmp_path / "journal", 1, "always")
    submit(core, journal, "a", 40)
    journal.close()
    calls = [0]

    def corrupting(fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".snap.tmp"):
            return REAL_WRITE(fd, data)
        calls[0] += 1
        if calls[0] == 2:  # the first frames: one byte in the middle flipped
            spoilt = bytearray(data)
            spoilt[len(spoilt) // 2] ^= 0xFF
            return REAL_WRITE(fd, spoilt)
        return REAL_WRITE(fd, data)

    monkeypatch.setattr(os, "write", corrupting)
    with pytest.raises(SnapshotUnverified, match="CRC mismatch"):
        write_snapshot(tmp_path, core, 1, os.getpid())
    assert [name for name in os.listdir(tmp_path) if "snap" in name] == []


def test_a_failed_snapshot_is_retried_with_a_growing_capped_backoff(tmp_path: Path) -> None:
    core = CoreDriver()
    journal = Journal(tmp_path, 1, "always")
    snapshots = Snapshots(journal, core, snapshot_bytes=4096)
    now = [100.0]
    snapshots.clock = lambda: now[0]
    submit(core, journal, "a", 20)  # more than snapshot_bytes: due
    assert snapshots.due()
    waits = []
    for _ in range(10):
        start = now[0]
        snapshots.start()
        snapshots.stop()  # (the child is not needed: its failure is what is tested)
        snapshots.failed("No space left on device")
        assert not snapshots.due()  # not at once
        while not snapshots.due():
            now[0] += 0.25
        waits.append(now[0] - start)
    assert waits[:3] == [Policy.SNAPSHOT_RETRY_SECONDS * f for f in (1, 2, 4)]
    assert max(waits) == Policy.SNAPSHOT_RETRY_MAX_SECONDS == waits[-1]
    assert snapshots.stats["snapshot_failures"] == 10
    snapshots.failed("again")
    snapshots.ask(1, 5)
    assert snapshots.due()  # an operator's SNAPSHOT_NOW does not wait for the backoff
    run_writer(snapshots)  # written: the backoff starts over
    assert snapshots.stats["snapshot_failures"] == 11
    submit(core, journal, "b", 20)
    snapshots.start()
    snapshots.stop()
    snapshots.failed("once more")
    now[0] += Policy.SNAPSHOT_RETRY_SECONDS
    assert snapshots.due()
    journal.close()
