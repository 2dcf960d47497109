"""The data directory: created if missing and locked so that two rsd never share it.

The lock is an exclusive ``flock`` on ``LOCK`` held for the life of the process; the
kernel drops it when the process dies however it dies, so a crash never leaves a stale
lock behind. The file holds the owner's pid, for the error message of the next one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["DataDir", "DataDirLocked"]


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
