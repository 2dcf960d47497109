"""A full disk while the journal writes its zeros ahead (journal.py) loses nothing.

The zeros are only about speed: a failed zeroing (ENOSPC part way) stops preallocating
and nothing else; every record is still written, fsynced and read back, the part of the
zeros that did land is cut off by a rotation, and the closed segment reads clean.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from rsd.core import Rec
from rsd.disk import journal as journal_module
from rsd.disk.datadir import segment_name
from rsd.disk.journal import Journal
from rsd.disk.logfile import JOURNAL_MAGIC, scan
from rsd.disk.recovery import Recovery


def record(n: int) -> tuple[object, ...]:
    return (Rec.CLEAN_SHUTDOWN + 1000, n, "x" * 50)  # the framing only: any typed record


async def synced(journal: Journal) -> None:
    done = asyncio.get_running_loop().create_future()
    journal.sync_in_background(lambda: done.set_result(None))
    await done
    while journal._zero_from is not None:
        await asyncio.sleep(0.001)


async def test_enospc_part_way_through_the_zeros_stops_preallocating_and_keeps_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    calls = 0

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls > 3:  # a few chunks land, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(journal_module.os, "pwrite", pwrite)
    journal = Journal(tmp_path, 1, "always")
    journal.write([record(1)])
    await synced(journal)
    assert not journal.preallocate  # it stopped trying
    path = tmp_path / segment_name(1)
    assert path.stat().st_size > journal._end  # the chunks that landed
    for n in range(2, 6):
        journal.write([record(n)])
        await synced(journal)
    assert calls == 4  # no further zeroing
    got = scan(path, JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == [1, 2, 3, 4, 5] and got.zero_tail
    end = journal._end
    journal.rotate()
    assert path.stat().st_size == end  # the zeros that landed are cut off
    assert scan(path, JOURNAL_MAGIC).damage is None
    journal.close()
    recovery = Recovery(tmp_path)
    assert [rec[1] for rec in recovery.records()][:5] == [1, 2, 3, 4, 5]
    assert recovery.report.clean
