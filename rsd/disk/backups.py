"""Backups of a running rsd: the latest snapshot and the journal after it, pinned and read
out in chunks (BACKUP_BEGIN, BACKUP_READ, BACKUP_END; ``rsctl backup DIR`` copies them,
checks the copy and puts it in place: rsctl/backup.py).

What always holds:
- BACKUP_BEGIN pins, on the loop between batches, the newest snapshot of the data
  directory and every segment after it, each by an open descriptor and a length: a
  closed segment's size, the open segment's ``Journal.records_end`` (every batch written
  by then, so every change acknowledged before the request, and only whole frames:
  never a write in progress, never the zeros written ahead). That set is what recovery
  would read after a crash at that instant, so a copy of it starts as that crash would:
  nothing acknowledged before BACKUP_BEGIN is missing from it;
- the pinned bytes never change: segments are appended to, never rewritten (a closed
  one is cut back to its records, which its pinned size already was, and the open one
  only grows past its pinned length), a snapshot is never rewritten; and they are read
  through the pinned descriptors, so a snapshot written meanwhile, which deletes the
  files it covers, takes their names but not their bytes;
- the loop never copies a file: a BACKUP_READ is one ``pread`` of at most
  ``Policy.BACKUP_CHUNK_BYTES``, answered like any request, so the connections around
  it are served between two reads; the copy's pace is the reader's;
- backups are an admin operation (PERMISSION_DENIED for a client-role token: a backup
  holds every tenant's data); at most ``Policy.MAX_BACKUPS`` are pinned at once, each
  of at most ``Policy.MAX_BACKUP_FILES`` files, so they never take the descriptors kept
  for the journal (RESOURCE_EXHAUSTED beyond); a connection has at most one (a second
  BACKUP_BEGIN replaces it), and it ends with BACKUP_END or with its connection.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsproto import ErrorCode

from ..core import CoreError
from ..core.ground.validate import int_arg, req_text
from ..policy import Policy
from .datadir import segments, snapshots
from .journal import Journal
from .logfile import FORMAT_VERSION
from .recovery import Recovery, RecoveryError

__all__ = ["Backups", "PinnedFile", "check_copy"]

_MAX_NAME_BYTES = 64  # a file name of the data directory (``journal-<16 hex>.log``)
_MAX_OFFSET = 1 << 62


@dataclass
class PinnedFile:
    """One file of a backup: its name, the length pinned, its open descriptor."""

    name: str
    length: int
    fd: int


class Backups:
    """The backups pinned in ``journal``'s data directory, by connection id."""

    def __init__(self, journal: Journal | None) -> None:
        self.journal = journal
        self.pinned: dict[int, dict[str, PinnedFile]] = {}

    def begin(self, conn: int, admin: bool) -> dict[str, Any]:
        """Pin the newest snapshot and the segments after it for ``conn``; what was
        pinned (``covers``: the last segment the snapshot covers, 0 without one;
        ``files``: name and length of each, the snapshot first). Raises CoreError."""
        _admin_only(admin, "BACKUP_BEGIN")
        journal = self.journal
        if journal is None:
            raise CoreError(ErrorCode.UNAVAILABLE,
                            "this server keeps no journal (no data directory): nothing to back up")
        self.end(conn, admin)
        if len(self.pinned) >= Policy.MAX_BACKUPS:
            raise CoreError(ErrorCode.RESOURCE_EXHAUSTED,
                            f"{Policy.MAX_BACKUPS} backups are already being taken "
                            "(max_backups); retry once one is done")
        names = os.listdir(journal.dir)
        found = snapshots(names)
        covers, snapshot = found[-1] if found else (0, None)
        wanted = [(seq, name) for seq, name in segments(names) if seq > covers]
        if len(wanted) + (snapshot is not None) > Policy.MAX_BACKUP_FILES:
            raise CoreError(ErrorCode.RESOURCE_EXHAUSTED,
                            f"{len(wanted)} journal segments since the last snapshot, more "
                            f"than a backup pins ({Policy.MAX_BACKUP_FILES} files): take a "
                            "snapshot first (SNAPSHOT_NOW, rsctl snapshot)")
        files: dict[str, PinnedFile] = {}
        try:
            if snapshot is not None:
                files[snapshot] = _pin(journal, snapshot, None)
            for seq, name in wanted:
                end = journal.records_end if seq == journal.seq else None
                files[name] = _pin(journal, name, end)
        except OSError as exc:
            _close(files)
            raise CoreError(ErrorCode.INTERNAL,
                            f"cannot open the data directory's files for a backup: {exc}") from None
        self.pinned[conn] = files
        return {
            "covers": covers,
            "format_version": FORMAT_VERSION,
            "files": [{"name": f.name, "length": f.length} for f in files.values()],
        }

    def read(self, conn: int, admin: bool, args: dict[str, Any]) -> dict[str, Any]:
        """A chunk of a pinned file: ``data``, at most ``length`` (default and most
        ``Policy.BACKUP_CHUNK_BYTES``) bytes from ``offset``, never past the length
        pinned (empty at or after it). Raises CoreError."""
        _admin_only(admin, "BACKUP_READ")
        files = self.pinned.get(conn)
        if files is None:
            raise CoreError(ErrorCode.NOT_FOUND, "no backup begun on this connection "
                            "(BACKUP_BEGIN first; a backup ends with its connection)")
        name = req_text(args, "file", _MAX_NAME_BYTES)
        offset = int_arg(args, "offset", 0, _MAX_OFFSET)
        length = int_arg(args, "length", 1, Policy.BACKUP_CHUNK_BYTES,
                         default=Policy.BACKUP_CHUNK_BYTES)
        pinned = files.get(name)
        if pinned is None:
            raise CoreError(ErrorCode.NOT_FOUND, f"{name!r} is not a file of this backup")
        size = max(0, min(length, pinned.length - offset))
        try:
            data = os.pread(pinned.fd, size, offset) if size else b""
        except OSError as exc:
            raise CoreError(ErrorCode.INTERNAL, f"cannot read {name}: {exc}") from None
        if len(data) != size:  # the pinned bytes are never cut: the disk lost them
            raise CoreError(ErrorCode.INTERNAL, f"{name} ends at {offset + len(data)}, "
                            f"before its pinned length {pinned.length}")
        return {"data": data}

    def end(self, conn: int, admin: bool) -> dict[str, Any]:
        """Unpin ``conn``'s backup (if any): ``ended``, whether there was one."""
        _admin_only(admin, "BACKUP_END")
        files = self.pinned.pop(conn, None)
        if files is not None:
            _close(files)
        return {"ended": files is not None}

    def forget(self, conn: int) -> None:
        """``conn`` is gone: its backup ends."""
        files = self.pinned.pop(conn, None)
        if files is not None:
            _close(files)

    def close(self) -> None:
        """At shutdown: every backup ends."""
        for conn in list(self.pinned):
            self.forget(conn)


def _admin_only(admin: bool, what: str) -> None:
    if not admin:
        raise CoreError(ErrorCode.PERMISSION_DENIED,
                        f"{what} is an admin operation (a backup holds every tenant's data); "
                        "this connection's token has the client role")


def _pin(journal: Journal, name: str, end: int | None) -> PinnedFile:
    """Open ``name`` of the data directory; its length is ``end``, or its size now."""
    fd = os.open(journal.dir / name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        length = os.fstat(fd).st_size if end is None else end
    except OSError:
        os.close(fd)
        raise
    return PinnedFile(name, length, fd)


def _close(files: dict[str, PinnedFile]) -> None:
    for pinned in files.values():
        os.close(pinned.fd)


def check_copy(directory: Path, covers: int) -> str | None:
    """Why the copy of a backup in ``directory`` would not start rsd as the data it was
    taken from (None: it would): read as recovery reads it (``Recovery``: every frame's
    salt, length and CRC, the snapshot's end record counting its records), with nothing
    cut off (a copy ends at a whole frame: a torn tail is a copy cut short), and every
    segment after the snapshot covering ``covers`` there, numbered on without a gap."""
    names = os.listdir(directory)
    found = snapshots(names)
    if covers and [seq for seq, _ in found] != [covers]:
        return f"the snapshot covering segment {covers} is missing"
    numbers = [seq for seq, _ in segments(names)]
    if numbers != list(range(covers + 1, covers + 1 + len(numbers))):
        return f"segments {numbers} do not follow segment {covers} without a gap"
    recovery = Recovery(directory)
    try:
        for _ in recovery.batches():
            pass
    except RecoveryError as exc:
        return str(exc)
    if recovery.report.truncated is not None:
        return f"cut short: {recovery.report.truncated}"
    return None
