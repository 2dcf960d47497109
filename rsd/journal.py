"""Appending to the journal: the segment being written, one write per batch, fsyncs.

What always holds:
- records go to the segment with the highest seq, one ``write`` call per batch (the
  batch is the unit that is whole or torn, see logfile.py); a new segment's header and
  directory entry are fsynced before any record goes into it; each segment has a salt
  of its own (logfile.py), so no record bytes a client chose can pass for a frame;
- a write or fsync that fails is fatal: rsd exits non-zero at once and never sends the
  replies that depended on it (after a failed fsync the page cache cannot be trusted);
- when replies wait for an fsync is group commit's rule (groupcommit.py), not this
  module's: here ``sync_now`` and ``sync_in_background`` only do it;
- the journal ends with CLEAN_SHUTDOWN only after a clean stop (``close``); its absence
  tells the core that records may have been lost (see core/ids.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import failpoints
from .core import Rec
from .datadir import segment_name, segments
from .logfile import JOURNAL_MAGIC, encode_batch, file_header, fsync_dir, new_salt
from .policy import Policy

__all__ = ["EXIT_IO_ERROR", "POLICIES", "Journal", "fatal"]

log = logging.getLogger("rsd.journal")

POLICIES = ("always", "everysec", "no")
EXIT_IO_ERROR = 74  # EX_IOERR


def fatal(message: str) -> None:
    """A write or fsync failed: the only safe move is to stop before acknowledging."""
    log.critical("%s; exiting without acknowledging unpersisted changes", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_IO_ERROR)


def _ignore(seconds: float) -> None:
    """No one is measuring fsyncs."""


class Journal:
    """The open segment ``seq`` of the journal in ``directory``, and its fsync policy."""

    def __init__(self, directory: Path, seq: int, policy: str = Policy.FSYNC) -> None:
        """Start segment ``seq`` (it must not exist). OSError if it cannot be created."""
        if policy not in POLICIES:
            raise ValueError(f"fsync policy must be one of {POLICIES}")
        self.dir = Path(directory)
        self.policy = policy
        self.seq = seq
        self.bytes_written = 0  # record bytes since start; snapshots.py measures from it
        self.unsynced = False  # bytes written since the last fsync
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.stats: dict[str, float] = {"writes": 0, "fsyncs": 0, "records": 0}
        self.salt = b""  # the open segment's salt (logfile.py), new for every segment
        # Called on the loop with each fsync's duration in seconds (the metrics).
        self.on_fsync: Callable[[float], None] = _ignore
        self._fd: int | None = self._open_segment()
        self._disk_base = 0
        self.measure()

    def measure(self) -> None:
        """Size the segments on disk (at start, and after a snapshot deleted some):
        ``disk_bytes`` then grows with every write, with no further look at the disk."""
        total = 0
        for _, name in segments(os.listdir(self.dir)):
            try:
                total += os.stat(self.dir / name).st_size
            except FileNotFoundError:
                continue
        self._disk_base = total - self.bytes_written

    @property
    def disk_bytes(self) -> int:
        """The journal segments' size on disk, in bytes."""
        return self._disk_base + self.bytes_written

    def _open_segment(self) -> int:
        path = self.dir / segment_name(self.seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.salt = new_salt()
        os.write(fd, file_header(JOURNAL_MAGIC, self.seq, self.salt))
        os.fsync(fd)
        fsync_dir(self.dir)
        return fd

    def write(self, records: list[tuple[Any, ...]]) -> None:
        """Append records (one write call). Fatal on failure."""
        if not records:
            return
        data = encode_batch(records, self.salt)
        failpoints.hit("journal.before_write.kill")
        try:
            failpoints.hit("journal.write.enospc")
            view = memoryview(data)
            while view:
                assert self._fd is not None
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            fatal(f"journal write failed: {exc}")
        self.stats["writes"] += 1
        self.stats["records"] += len(records)
        self.bytes_written += len(data)
        self.unsynced = True

    def _fdatasync(self, fd: int) -> float:
        """fdatasync ``fd``; its duration in seconds (returned, never shared: this runs on
        the fsync thread, and the loop takes the figure from the future)."""
        failpoints.hit("journal.before_fsync.kill")
        failpoints.hit("journal.fsync.eio")
        began = time.perf_counter()
        os.fdatasync(fd)
        return time.perf_counter() - began

    def sync_now(self) -> None:
        """fdatasync on the caller's thread. Fatal on failure."""
        if self._fd is None or not self.unsynced:
            return
        self.unsynced = False
        try:
            seconds = self._fdatasync(self._fd)
        except OSError as exc:
            fatal(f"journal fsync failed: {exc}")
        self.stats["fsyncs"] += 1
        self.on_fsync(seconds)
        failpoints.hit("journal.after_fsync.kill")

    def sync_in_background(self, done: Callable[[], None]) -> None:
        """fdatasync on the journal thread; ``done()`` runs on the loop afterwards."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="rsd-fsync"
            )
        fd = self._fd
        assert fd is not None
        self.unsynced = False
        future = loop.run_in_executor(self._executor, self._fdatasync, fd)

        def finished(fut: asyncio.Future[float]) -> None:
            exc = fut.exception()
            if exc is not None:
                fatal(f"journal fsync failed: {exc}")
            self.stats["fsyncs"] += 1
            self.on_fsync(fut.result())
            failpoints.hit("journal.after_fsync.kill")
            done()

        future.add_done_callback(finished)

    def rotate(self) -> int:
        """fsync and close this segment, start the next; returns the seq of the closed one.

        Call only between batches, with no fsync in flight. Fatal if the next segment
        cannot be started.
        """
        self.sync_now()
        closed = self.seq
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        self.seq += 1
        try:
            self._fd = self._open_segment()
        except OSError as exc:
            fatal(f"cannot start journal segment {self.seq}: {exc}")
        return closed

    def close(self) -> None:
        """A clean stop: CLEAN_SHUTDOWN, fsync, close."""
        if self._fd is None:
            return
        self.write([(Rec.CLEAN_SHUTDOWN, time.time())])
        self.sync_now()
        os.close(self._fd)
        self._fd = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
