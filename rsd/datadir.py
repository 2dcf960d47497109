"""The data directory: its lock, and the names of the files it holds.

Files in it:
- ``journal-<seq>.log``: segments of records (see logfile.py), written in order; the
  one with the highest seq is being appended to (journal.py);
- ``snapshot-<seq>.snap``: the whole live state as records, covering every segment up
  to and including ``<seq>`` (snapshots.py); ``.tmp`` while it is being written;
- ``*.damaged``: files set aside by ``--repair`` (recovery.py), never read again;
- ``LOCK``: the lock.

The lock is an exclusive ``flock`` on ``LOCK`` held for the life of the process; the
kernel drops it when the process dies however it dies, so a crash never leaves a stale
lock behind. The file holds the owner's pid, for the error message of the next one.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DataDir",
    "DataDirLocked",
    "segment_name",
    "segments",
    "snapshot_name",
    "snapshots",
]

_SEGMENT = re.compile(r"^journal-([0-9a-f]{16})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-([0-9a-f]{16})\.snap$")


def segment_name(seq: int) -> str:
    return f"journal-{seq:016x}.log"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:016x}.snap"


def segments(names: Iterable[str]) -> list[tuple[int, str]]:
    """The journal segments among ``names``, as (seq, name), oldest first."""
    return sorted((int(m.group(1), 16), n) for n in names if (m := _SEGMENT.match(n)))


def snapshots(names: Iterable[str]) -> list[tuple[int, str]]:
    """The snapshots among ``names``, as (seq covered, name), oldest first."""
    return sorted((int(m.group(1), 16), n) for n in names if (m := _SNAPSHOT.match(n)))


class DataDirLocked(Exception):
    pass


class DataDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data directory {self.path} is locked by another rsd (pid {owner})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
