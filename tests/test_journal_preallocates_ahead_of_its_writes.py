"""The journal writes zeros ahead of its records (rsd/disk/journal.py) so that its fdatasyncs
flush data only, and the zeros after the last frame are the end of the log.

The rules protected: the zeros never cover a record (not even one written while they
are being written, larger than the margin); a segment closed by a rotation or a clean
stop is cut back to its records; after a kill -9 the zeros are the end of the log (no
torn-tail warning, nothing acknowledged lost, the segment cut back to its records); and
the old layout (no zeros) still reads the same.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.core import Rec
from rsd.disk.datadir import segment_name
from rsd.disk.journal import PREALLOCATE_BYTES, Journal
from rsd.disk.logfile import HEADER_BYTES, JOURNAL_MAGIC, scan
from rsd.disk.recovery import Recovery


def record(n: int, pad: int = 0) -> tuple[object, ...]:
    return (Rec.CLEAN_SHUTDOWN + 1000, n, "x" * pad)  # the framing only: any typed record


async def synced(journal: Journal) -> None:
    """One background fdatasync, and the zeroing it starts, completed."""
    done = asyncio.get_running_loop().create_future()
    journal.sync_in_background(lambda: done.set_result(None))
    await done
    while journal._zero_from is not None:  # the zeros' completion, queued on the loop
        await asyncio.sleep(0.001)


def segment(directory: Path, seq: int) -> Path:
    return directory / segment_name(seq)


async def test_a_background_fsync_writes_zeros_ahead_and_records_still_read_back(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, 1, "always")
    journal.write([record(1)])
    await synced(journal)
    path = segment(tmp_path, 1)
    end = journal._end
    assert path.stat().st_size >= end + PREALLOCATE_BYTES // 2  # zeros ahead, in place
    journal.write([record(2)])  # written over the zeros, at the records' end
    await synced(journal)
    got = scan(path, JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == [1, 2]
    assert got.zero_tail and got.torn_tail and got.damage_at == journal._end
    assert journal.disk_bytes == journal._end  # the zeros are not journal bytes
    journal.close()
    assert path.stat().st_size == journal._end  # a clean stop cuts the zeros off
    assert scan(path, JOURNAL_MAGIC).damage is None


async def test_a_batch_larger_than_the_margin_waits_for_the_zeros_and_is_never_covered(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, 1, "always")
    journal.write([record(0)])
    done = asyncio.get_running_loop().create_future()
    journal.sync_in_background(lambda: done.set_result(None))  # starts the zeroing
    assert journal._zero_from is not None
    big = [record(n, pad=64 << 10) for n in range(1, 3 * PREALLOCATE_BYTES // (64 << 10))]
    journal.write(big)  # reaches past where the zeros start: waits for them first
    await done
    await synced(journal)
    got = scan(segment(tmp_path, 1), JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == list(range(len(big) + 1))
    assert got.damage is None or got.zero_tail
    journal.close()


async def test_a_rotation_cuts_the_closed_segment_back_to_its_records(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1, "always")
    journal.write([record(1)])
    await synced(journal)
    end = journal._end
    assert segment(tmp_path, 1).stat().st_size > end
    assert journal.rotate() == 1
    assert segment(tmp_path, 1).stat().st_size == end
    journal.write([record(2)])
    await synced(journal)  # the new segment is preallocated in its turn
    assert segment(tmp_path, 2).stat().st_size > journal._end
    assert [rec[1] for rec in scan(segment(tmp_path, 1), JOURNAL_MAGIC).records] == [1]
    journal.close()
    recovery = Recovery(tmp_path)
    assert [rec[1] for rec in recovery.records()][:2] == [1, 2]
    assert recovery.report.clean and recovery.report.truncated is None


async def test_zeros_after_a_crash_end_the_log_quietly_and_are_cut_off(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1, "always")
    for n in range(5):
        journal.write([record(n)])
        await synced(journal)
    end = journal._end
    os.close(journal._fd)  # a crash: no clean stop, the zeros stay
    journal._fd = None
    path = segment(tmp_path, 1)
    assert path.stat().st_size > end
    recovery = Recovery(tmp_path)
    assert [rec[1] for rec in recovery.records()] == list(range(5))
    assert recovery.report.truncated is None and not recovery.report.clean
    recovery.mend()
    assert path.stat().st_size == end


async def test_fsync_no_writes_no_zeros(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1, "no")
    journal.write([record(1)])
    journal.sync_now()
    assert segment(tmp_path, 1).stat().st_size == journal._end > HEADER_BYTES
    journal.close()


async def acknowledged(address: str, count: int) -> list[str]:
    async with AsyncRunstate(holder="writer", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        tickets = await asyncio.gather(*(box.submit({"n": i}, key=f"k{i}")
                                         for i in range(count)))
        return [ticket.id for ticket in tickets]


async def test_kill_9_mid_segment_loses_nothing_acknowledged_and_warns_of_no_tear(
    tmp_path: Path,
) -> None:
    rsd = Rsd(tmp_path / "rsd")
    try:
        address = await rsd.start("--fsync", "always")
        ids = await acknowledged(address, 200)
        await rsd.kill()
        last = rsd.segments()[-1]
        size = last.stat().st_size
        got = scan(last, JOURNAL_MAGIC)
        assert got.zero_tail and size > got.good_end  # killed with zeros ahead
        address = await rsd.start("--fsync", "always")
        assert "torn tail" not in rsd.log()
        assert last.stat().st_size == got.good_end  # cut back to its records
        async with AsyncRunstate(holder="reader", address=address) as rs:
            for task_id in ids:
                await rs.scope("s").task(task_id).status()  # NotFoundError if lost
        assert await rsd.stop() == 0
    finally:
        if rsd.alive:
            await rsd.kill()


async def test_a_write_within_half_a_chunk_never_waits_for_the_zeros(tmp_path: Path) -> None:
    """The zeros start half a chunk past the records: the loop never blocks on them for
    a batch smaller than that, not even in a new segment (no zeros ahead yet)."""
    journal = Journal(tmp_path, 1, "always")
    waits: list[int] = []
    journal._wait_for_zeros = lambda: waits.append(journal._end)  # type: ignore[method-assign]
    journal.write([record(0)])
    done = asyncio.get_running_loop().create_future()
    journal.sync_in_background(lambda: done.set_result(None))
    assert journal._zero_from is not None  # the zeroing is under way
    journal.write([record(n, pad=1000) for n in range(1, 400)])  # ~400 KB
    assert waits == []
    await done
    await synced(journal)
    got = scan(segment(tmp_path, 1), JOURNAL_MAGIC)
    assert [rec[1] for rec in got.records] == list(range(400))
    journal.close()


async def test_a_rotation_right_after_the_zeros_cuts_them_though_the_loop_was_not_told(
    tmp_path: Path,
) -> None:
    """The zeros' completion is queued on the loop; a rotation that runs first must cut
    them all the same, or the closed segment (no longer the last) would end in zeros."""
    journal = Journal(tmp_path, 1, "always")
    journal.write([record(1)])
    done = asyncio.get_running_loop().create_future()
    journal.sync_in_background(lambda: done.set_result(None))
    journal._wait_for_zeros()  # the zeros are written; their completion not yet run
    end = journal._end
    assert segment(tmp_path, 1).stat().st_size > end
    journal.rotate()  # no fsync in flight (its completion aside): as snapshots.py does
    assert segment(tmp_path, 1).stat().st_size == end
    await done
    journal.close()
    recovery = Recovery(tmp_path)
    assert [rec[1] for rec in recovery.records()][:1] == [1] and recovery.report.clean
