"""The data directory: its lock, and the names of the files it holds.

Files in it:
- ``journal-<seq>.log``: segments of records (see logfile.py), written in order; the
  one with the highest seq is being appended to (journal.py);
- ``snapshot-<seq>.snap``: the whole live state as records, covering every segment up
  to and including ``<seq>`` (snapshots.py); ``.tmp`` while it is being written;
- ``*.damaged``: files set aside by ``--repair`` (recovery.py), never read again;
- ``LOCK``: the lock.

The lock is an exclusive ``flock`` on the directory itself, held on an open descriptor
for the life of the process: deleting ``LOCK`` (or anything else in the directory)
cannot lift it, and the kernel drops it when the process dies however it dies, so a
crash never leaves a stale lock behind. ``LOCK`` holds the owner's pid, for the error
message of the next one, and is ``flock``ed too (an older rsd locked only that file).

What always holds while rsd runs (``problem``, checked every ``CHECK_SECONDS`` by
``watch``): the path still names the directory that was locked, and ``LOCK`` in it the
file that was locked (same st_dev and st_ino). A directory removed or replaced under
rsd, or a ``LOCK`` replaced by another file, is reported, and rsd stops (cli.py) rather
than write into files nobody will find; a ``LOCK`` merely deleted is written again (the
directory's lock still holds). A start checks the same after locking, so a directory
swapped between its open and its lock is never served.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "CHECK_SECONDS",
    "DataDir",
    "DataDirLocked",
    "segment_name",
    "segments",
    "snapshot_name",
    "snapshots",
]

log = logging.getLogger("rsd")

CHECK_SECONDS = 0.5  # a removed data directory is noticed within this (and one loop turn)
# How long a start waits for the lock while the rsd that held it has died (see _flock),
# and how often it tries meanwhile.
DEAD_OWNER_WAIT_SECONDS = 5.0
DEAD_OWNER_POLL_SECONDS = 0.02
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


def _alive(pid: str) -> bool:
    """Whether ``pid`` (as LOCK holds it) names a running process: not one that has
    exited (gone, or a zombie its parent has not reaped yet). An unreadable pid counts as
    alive: the lock is then refused at once, as before rsd wrote pids."""
    if not pid.isdigit():
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class DataDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._dir_fd: int | None = None
        self._lock_fd: int | None = None
        self._timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        """Create the directory if need be and lock it. DataDirLocked if another rsd
        holds it (or it changed while being locked), OSError if it cannot be used."""
        self.path.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._lock_fd = self._lock(dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        self._dir_fd = dir_fd
        problem = self.problem()
        if problem is not None:
            self.close()
            raise DataDirLocked(f"{problem} while rsd was locking it; not starting")
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)

    def _lock(self, dir_fd: int) -> int:
        """Lock the directory, then its LOCK file; the LOCK file's descriptor."""
        try:
            self._flock(dir_fd)
        except BlockingIOError:
            raise self._locked() from None
        except OSError as exc:  # NFS emulates flock with fcntl locks: not on a directory
            log.warning("cannot lock the data directory %s itself (%s): only its LOCK file "
                        "is locked, which deleting LOCK would lift", self.path, exc)
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._flock(fd)
        except BlockingIOError:
            os.close(fd)
            raise self._locked() from None
        return fd

    def _flock(self, fd: int) -> None:
        """``flock`` ``fd``, waiting up to ``DEAD_OWNER_WAIT_SECONDS`` while the rsd that
        holds it has died (BlockingIOError if it is alive, or the wait ends). A process
        rsd forked (a snapshot's or a standby copy's writer) holds the lock too, and dies
        of its parent's death (PR_SET_PDEATHSIG) a moment after it, or once a write it is
        in ends: a start right after a kill -9 must not take that for another rsd."""
        deadline = time.monotonic() + DEAD_OWNER_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline or _alive(self._owner()):
                    raise
            time.sleep(DEAD_OWNER_POLL_SECONDS)

    def _owner(self) -> str:
        """The pid LOCK names ('' if it cannot be read)."""
        try:
            return (self.path / "LOCK").read_bytes()[:32].decode(errors="replace").strip()
        except OSError:
            return ""

    def _locked(self) -> DataDirLocked:
        owner = self._owner()
        return DataDirLocked(
            f"data directory {self.path} is locked by another rsd (pid {owner or 'unknown'})"
        )

    def problem(self) -> str | None:
        """Why the path no longer names the directory (or LOCK the file) rsd locked; None
        while it does. Two stats. A LOCK merely deleted is written again, here."""
        assert self._dir_fd is not None and self._lock_fd is not None
        try:
            now = os.stat(self.path)
        except OSError as exc:
            return f"data directory {self.path} is gone ({exc.strerror})"
        if not _same(now, os.fstat(self._dir_fd)):
            return f"data directory {self.path} was replaced by another directory"
        lock = self.path / "LOCK"
        try:
            named = os.stat(lock)
        except FileNotFoundError:
            return self._write_lock_again()
        except OSError as exc:
            return f"cannot check {lock}: {exc.strerror}"
        if not _same(named, os.fstat(self._lock_fd)):
            return f"{lock} was replaced by another file (another rsd on this directory?)"
        return None

    def _write_lock_again(self) -> str | None:
        """LOCK was deleted: the directory's lock still holds; put the pid back."""
        lock = self.path / "LOCK"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return f"{lock} was replaced by another file (another rsd on this directory?)"
        except OSError as exc:
            return f"cannot write {lock} again: {exc.strerror}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # taken between its creation and the lock: another rsd
            os.close(fd)
            return f"cannot lock {lock} again ({exc.strerror}): another rsd on this directory?"
        assert self._lock_fd is not None
        os.close(self._lock_fd)
        self._lock_fd = fd
        log.warning("%s was deleted while rsd ran; written again (the directory stays "
                    "locked by this rsd)", lock)
        return None

    def watch(
        self, loop: asyncio.AbstractEventLoop, lost: Callable[[str], None],
        interval: float = CHECK_SECONDS,
    ) -> None:
        """Check ``problem`` every ``interval`` seconds; ``lost(why)`` once it has one."""
        def check() -> None:
            try:
                problem = self.problem()
            except OSError as exc:
                problem = f"cannot check data directory {self.path}: {exc}"
            if problem is not None:
                self._timer = None
                lost(problem)
                return
            self._timer = loop.call_later(interval, check)

        self._timer = loop.call_later(interval, check)

    def stop_watching(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.stop_watching()
        for fd in (self._lock_fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = self._dir_fd = None
