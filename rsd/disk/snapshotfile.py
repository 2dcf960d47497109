"""A snapshot file: written whole, read back and checked, then renamed into place.

What always holds:
- ``snapshot-<seq>.snap`` holds the live state as records, the last one SNAPSHOT_END
  counting the others; it is written to ``.tmp``, fsynced, read back from the disk and
  checked (every frame's salt, length and CRC as recovery checks them, the header's seq,
  the record count: ``verify``), and only then renamed and the directory fsynced: no
  file that recovery would refuse ever takes the place of what it covers;
- every byte goes through ``logfile.write_all`` (a short write on a full disk is
  finished or raises), as the journal's do;
- a failure removes the ``.tmp`` (on a full disk its space is what the journal needs
  next) and raises OSError: nothing else changed;
- the file has a salt of its own (logfile.py), drawn by the process that writes it;
- ``delete_covered`` runs only after a snapshot is in place (snapshots.py, startup.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

from ..core import Core, Rec
from ..core.records.snaprecords import SnapshotEnd
from . import failpoints
from .datadir import segments, snapshot_name, snapshots
from .logfile import (
    SNAPSHOT_MAGIC,
    FileDamaged,
    encode_batch,
    file_header,
    fsync_dir,
    new_salt,
    read_back,
    write_all,
)

__all__ = ["SnapshotUnverified", "delete_covered", "verify", "write_snapshot"]


class SnapshotUnverified(OSError):
    """A snapshot just written does not read back whole: never put in place. An OSError
    (EIO): the disk gave back other bytes than were written, as callers of a failed
    write expect (the repair at start-up then stops rsd like any disk error)."""


def write_snapshot(directory: Path, core: Core, covers: int, parent: int) -> None:
    """Write ``core``'s live state as the snapshot covering segments up to ``covers``.

    Every byte is written (``write_all``: a short write on a full disk is finished or
    raises), fsynced, then read back from the disk and checked (``verify``) before the
    file is renamed into place. On any failure the temporary file is removed (on a full
    disk its space is what the journal needs next) and the error raised: nothing else
    changed, so the journal still holds everything.
    """
    final = directory / snapshot_name(covers)
    tmp = final.with_name(final.name + ".tmp")
    salt = new_salt()  # by the writing process (the forked child): never the journal's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_all(fd, file_header(SNAPSHOT_MAGIC, covers, salt))
            batch: list[tuple[Any, ...]] = []
            count = 0
            for rec in core.snapshot():
                batch.append(rec)
                count += 1
                if len(batch) == 2000:
                    write_all(fd, encode_batch(batch, salt))
                    batch.clear()
                    failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
            batch.append(SnapshotEnd(Rec.SNAPSHOT_END, count))
            data = encode_batch(batch, salt)
            half = len(data) // 2
            write_all(fd, data[:half])
            failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
            failpoints.hit("snapshot.write.enospc")
            write_all(fd, data[half:])
            os.fsync(fd)
            with contextlib.suppress(OSError, AttributeError):  # read back the disk's bytes
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        verify(tmp, covers, count)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.replace(tmp, final)
    fsync_dir(directory)


def verify(path: Path, covers: int, count: int) -> None:
    """Check that the snapshot file at ``path`` is whole: its header names ``covers``,
    every frame is valid (salt, length, CRC, records: ``read_back``), and it holds
    ``count`` records and then the end record counting them, as recovery requires.
    Raises SnapshotUnverified saying what is wrong."""
    try:
        seq, frames = read_back(path, SNAPSHOT_MAGIC)
        if seq != covers:
            raise SnapshotUnverified(
                errno.EIO, f"{path}: header says it covers {seq}, not {covers}"
            )
        seen = 0
        last: list[Any] | None = None
        for records in frames:
            seen += len(records)
            last = records[-1]
    except FileDamaged as exc:
        raise SnapshotUnverified(errno.EIO, f"snapshot read back damaged: {exc}") from None
    if seen != count + 1 or last is None or last[0] != Rec.SNAPSHOT_END or last[1] != count:
        raise SnapshotUnverified(
            errno.EIO,
            f"{path}: read back {seen} records ending with {last and last[:2]!r}, "
            f"expected {count} and the end record counting them"
        )


def delete_covered(directory: Path, covers: int, keep_snapshot: str | None) -> None:
    """Delete the segments up to ``covers`` and every snapshot but ``keep_snapshot``."""
    names = os.listdir(directory)
    for seq, name in segments(names):
        if seq <= covers:
            (directory / name).unlink()
    for _, name in snapshots(names):
        if name != keep_snapshot:
            (directory / name).unlink()
    fsync_dir(directory)
