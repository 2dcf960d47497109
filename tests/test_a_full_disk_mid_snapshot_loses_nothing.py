"""A disk that fills in the middle of a snapshot loses nothing acknowledged: a real rsd
on a small real file system (ext4 on a loop device).

The disk is filled (a filler file) so that the snapshot rsd is asked for runs out of
space inside its writer's last write: the kernel then writes what fits and returns the
count without an error. The snapshot must fail (SNAPSHOT_NOW answered INTERNAL), leave
no ``.snap.tmp`` behind and keep every journal segment; once the filler is removed, a
restart finds every task a client saw acknowledged, from the recorded history. Before
checked writes, that short write was fsynced, renamed into place and the segments it
covered deleted: the restart refused ("damaged snapshot ... record cut short").

The free space is exact, not guessed: a first snapshot of the same state gives the size
of the second one; tasks submitted between them live only in the journal. ``--fsync
no`` keeps the journal from writing zeros ahead of its records (those would make the
free space at the snapshot depend on timing); every stop here is clean, so no
acknowledged change depends on an fsync. Needs root and loop devices: skipped without
(tests/test_a_snapshot_cut_short_by_a_full_disk_replaces_nothing.py proves the same
rule everywhere with a fake disk, and the failpoint test below the same path through a
real rsd: ``snapshot.write.enospc`` fails every snapshot writer's last write).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, NotFoundError, RunstateError

DISK_BYTES = 32 << 20
PAD = 8000  # bytes of data per task: about 2.4 MB of state for the snapshot to hold


def _run(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=30, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A mounted ext4 file system of DISK_BYTES (no blocks reserved for root)."""
    if os.geteuid() != 0 or not (shutil.which("mkfs.ext4") and shutil.which("mount")):
        pytest.skip("needs root, mkfs.ext4 and mount for a loop-mounted file system")
    image, mount = tmp_path / "disk.img", tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(DISK_BYTES)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.decode(errors='replace')}")
    mounted = _run("mount", "-o", "loop", str(image), str(mount))
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {mounted.stderr.decode(errors='replace')}")
    try:
        yield mount
    finally:
        if _run("umount", str(mount)).returncode != 0:
            _run("umount", "-l", str(mount))


async def submit(address: str, prefix: str, count: int) -> list[str]:
    """Submit ``count`` tasks; the ids of those acknowledged (all, or the test fails)."""
    async with AsyncRunstate(holder="writer", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        items = [{"key": f"{prefix}{n}", "data": {"pad": f"{n:08}" * (PAD // 8)}}
                 for n in range(count)]
        tickets = await box.submit_many(items)
        return [ticket.id for ticket in tickets]  # type: ignore[union-attr]


async def missing(address: str, task_ids: list[str]) -> list[str]:
    async with AsyncRunstate(holder="reader", address=address) as rs:
        await rs.scopes.create(id="s")
        lost = []
        for task_id in task_ids:
            with contextlib.suppress(NotFoundError):
                await rs.scope("s").task(task_id).status()
                continue
            lost.append(task_id)
        return lost


async def test_a_disk_full_inside_the_snapshots_last_write_keeps_the_journal_whole(
    small_disk: Path, tmp_path: Path
) -> None:
    rsd = Rsd(tmp_path / "rsd")  # its logs off the small disk
    rsd.data = small_disk / "data"
    try:
        address = await rsd.start("--fsync", "no", "--snapshot-bytes", str(1 << 40))
        acknowledged = await submit(address, "a", 300)
        async with AsyncRunstate(holder="admin", address=address) as rs:
            first = await rs.admin.snapshot()
        size = (rsd.data / first["snapshot"]).stat().st_size
        acknowledged += await submit(address, "b", 3)  # in the journal only
        # The next snapshot holds about ``size`` bytes (3 tasks more), its last write
        # the second half: the disk fills 3/4 of the way through the file.
        stat = os.statvfs(small_disk)
        free = stat.f_bavail * stat.f_frsize
        filler = free - (size * 3) // 4
        with open(small_disk / "filler", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, filler)
        segments_before = sorted(p.name for p in rsd.data.glob("journal-*.log"))

        async with AsyncRunstate(holder="admin", address=address) as rs:
            with pytest.raises(RunstateError, match="the journal keeps everything"):
                await rs.admin.snapshot()
            names = os.listdir(rsd.data)
            stats = await rs.admin.stats()
        assert not [name for name in names if name.endswith(".tmp")], names
        assert [name for name in names if name.endswith(".snap")] == [first["snapshot"]]
        assert set(segments_before) <= set(names)
        assert stats["journal"]["snapshot_failures"] == 1
        assert "snapshot writer failed (" in rsd.log() and "No space left" in rsd.log()
        assert await rsd.stop() == 0

        (small_disk / "filler").unlink()
        address = await rsd.start()
        assert await missing(address, acknowledged) == []
        assert await rsd.stop() == 0
    finally:
        if rsd.alive:
            await rsd.kill()


async def test_a_snapshot_writer_failing_with_enospc_keeps_everything_acknowledged(
    rsds: Callable[..., Rsd],
) -> None:
    rsd = rsds()
    address = await rsd.start("--snapshot-bytes", str(1 << 40),
                              failpoints="snapshot.write.enospc")
    acknowledged = await submit(address, "a", 50)
    async with AsyncRunstate(holder="admin", address=address) as rs:
        with pytest.raises(RunstateError, match="the journal keeps everything"):
            await rs.admin.snapshot()
        names = os.listdir(rsd.data)
        stats = await rs.admin.stats()
    acknowledged += await submit(address, "b", 50)
    assert not [name for name in names if name.endswith((".tmp", ".snap"))], names
    assert stats["journal"]["snapshot_failures"] == 1
    log = rsd.log()
    assert log.count("snapshot writer failed (OSError: [Errno 28] No space left") == 1, log
    assert await rsd.stop() == 0
    address = await rsd.start()
    assert await missing(address, acknowledged) == []
    assert await rsd.stop() == 0
