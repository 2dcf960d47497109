"""Appending to the journal: the segment being written, one write per batch, fsyncs.

What always holds:
- records go to the segment with the highest seq, one write per batch (the batch is
  the unit that is whole or torn, see logfile.py), every byte of it checked: all writes
  go through ``logfile.write_all``, which writes the rest of a short write again and
  raises when no byte goes; a new segment's header and
  directory entry are fsynced before any record goes into it; each segment has a salt
  of its own (logfile.py), so no record bytes a client chose can pass for a frame;
- a write or fsync that fails is fatal: rsd exits non-zero at once and never sends the
  replies that depended on it (after a failed fsync the page cache cannot be trusted);
- when replies wait for an fsync is group commit's rule (groupcommit.py), not this
  module's: here ``sync_now`` and ``sync_in_background`` only do it;
- the journal ends with CLEAN_SHUTDOWN only after a clean stop (``close``); its absence
  tells the core that records may have been lost (see core/ids.py);
- the open segment is preallocated ahead of the writes (``PREALLOCATE_BYTES`` of zeros
  written and fsynced on the fsync thread, never over a record), so that most fdatasyncs
  flush data only: an fdatasync that also grows the file must wait for a commit of the
  file system's journal, shared with every other process writing to that disk. Records
  are written at the segment's own offset (no O_APPEND). After a crash the zeros after
  the last frame are the end of the log (logfile.py); a segment closed by ``rotate`` or
  ``close`` is cut back to its records. Preallocating is only about speed: whatever the
  zeroing did or did not finish, every record is durable by its own fdatasync.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import Rec
from ..core.records import CleanShutdown
from ..policy import Policy
from . import failpoints
from .datadir import segment_name, segments
from .logfile import (
    JOURNAL_MAGIC,
    encode_batch,
    file_header,
    fsync_dir,
    new_salt,
    write_all,
)

__all__ = ["EXIT_IO_ERROR", "POLICIES", "Journal", "fatal"]

log = logging.getLogger("rsd.disk.journal")

POLICIES = ("always", "everysec", "no")
EXIT_IO_ERROR = 74  # EX_IOERR
PREALLOCATE_BYTES = 2 << 20  # zeros written ahead of the records at a time
_ZEROS = bytes(1 << 16)


def fatal(message: str) -> None:
    """A write or fsync failed: the only safe move is to stop before acknowledging."""
    log.critical("%s; exiting without acknowledging unpersisted changes", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_IO_ERROR)


def _ignore(seconds: float) -> None:
    """No one is measuring fsyncs."""


class _SyncThread:
    """The journal's one thread: runs its jobs (fdatasyncs, zeros ahead) in the order
    given, and hands each result to the loop with one ``call_soon_threadsafe``: one
    wake-up of the loop per job and no futures between (the gap between an fsync's end
    and the release of the replies it covers is the latency of every held reply)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="rsd-fsync", daemon=True)
        self._thread.start()

    def submit(
        self, job: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Run ``job()`` on the thread, then ``done(result, exception)`` on the loop."""
        self._jobs.put((job, done))

    def _run(self) -> None:
        call = self._loop.call_soon_threadsafe
        while (item := self._jobs.get()) is not None:
            job, done = item
            try:
                result, exc = job(), None
            except BaseException as caught:  # handed to the loop, which decides
                result, exc = None, caught
            with contextlib.suppress(RuntimeError):  # a closed loop: no one is waiting
                call(done, result, exc)

    def stop(self) -> None:
        """Run the jobs given so far, then end the thread."""
        self._jobs.put(None)
        self._thread.join()


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
        self._thread: _SyncThread | None = None  # started by the first background fsync
        self.stats: dict[str, float] = {"writes": 0, "fsyncs": 0, "records": 0}
        self.salt = b""  # the open segment's salt (logfile.py), new for every segment
        # Called on the loop with each fsync's duration in seconds (the metrics).
        self.on_fsync: Callable[[float], None] = _ignore
        self._end = 0  # the open segment's size in records (where the next write goes)
        self._zeroed = 0  # the open segment's size in zeros and records, once fsynced
        # Held from the loop's asking for zeros from ``_zero_from`` until the fsync thread
        # wrote them: a write reaching that far waits for it (a batch over the margin).
        self._zeroing = threading.Lock()
        self._zero_from: int | None = None
        self.preallocate = policy != "no"  # only a background fsync starts the zeroing
        self._fd: int | None = self._open_segment()
        self._disk_base = 0
        self.measure()

    def measure(self) -> None:
        """Size the segments on disk (at start, and after a snapshot deleted some):
        ``disk_bytes`` then grows with every write, with no further look at the disk."""
        total = 0
        for seq, name in segments(os.listdir(self.dir)):
            if seq == self.seq and self._fd is not None:
                total += self._end  # its records, not the zeros written ahead of them
                continue
            try:
                total += os.stat(self.dir / name).st_size
            except FileNotFoundError:
                continue
        self._disk_base = total - self.bytes_written

    @property
    def records_end(self) -> int:
        """The open segment's length in whole frames: every batch written so far (so
        every change acknowledged), never a torn write nor the zeros written ahead."""
        return self._end

    @property
    def disk_bytes(self) -> int:
        """The journal segments' size on disk, in bytes."""
        return self._disk_base + self.bytes_written

    def _open_segment(self) -> int:
        path = self.dir / segment_name(self.seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.salt = new_salt()
        header = file_header(JOURNAL_MAGIC, self.seq, self.salt)
        write_all(fd, header)
        os.fsync(fd)
        fsync_dir(self.dir)
        self._end = self._zeroed = len(header)
        return fd

    def write(self, records: list[tuple[Any, ...]]) -> None:
        """Append records (one write call). Fatal on failure."""
        if not records:
            return
        data = encode_batch(records, self.salt)
        failpoints.hit("journal.before_write.kill")
        if self._zero_from is not None and self._end + len(data) > self._zero_from:
            self._wait_for_zeros()
        try:
            failpoints.hit("journal.write.enospc")
            assert self._fd is not None
            self._still_named(self._fd)
            write_all(self._fd, data)
        except OSError as exc:
            fatal(f"journal write failed: {exc}")
        self.stats["writes"] += 1
        self.stats["records"] += len(records)
        self.bytes_written += len(data)
        self._end += len(data)
        self.unsynced = True

    def _wait_for_zeros(self) -> None:
        """Block until the zeros being written ahead are in place (the records about to
        be written reach into them; rare: only a batch larger than the margin)."""
        with self._zeroing:
            pass

    def _zero(self, fd: int, start: int, stop: int) -> None:
        """On the fsync thread: write zeros over [start, stop) of the open segment, past
        every record, and fsync them (the file's new size is metadata: committed here,
        once, not by the fdatasyncs that follow). Releases ``_zeroing`` when done.

        A failed write only stops the preallocation (the records' own writes report a
        full disk); a failed fsync is fatal, as for records: it may have consumed the
        error report of a record's page, which the next fdatasync would then not see."""
        try:
            for pos in range(start, stop, len(_ZEROS)):
                write_all(fd, _ZEROS[: min(len(_ZEROS), stop - pos)], pos)
        except OSError as exc:
            log.warning("cannot preallocate the journal segment (%s); not trying again", exc)
            self.preallocate = False
            return
        else:
            try:
                os.fsync(fd)
            except OSError as exc:
                fatal(f"journal fsync failed: {exc}")
        finally:
            self._zeroing.release()

    def _zeroed_up_to(self, seq: int, stop: int) -> None:
        """On the loop, after ``_zero``: segment ``seq`` is zeroed up to ``stop`` (unless
        it was closed meanwhile: ``_cut_zeros`` waited for the zeros and cut them)."""
        if seq != self.seq:
            return
        if self._zero_from is not None and self.preallocate:
            self._zeroed = max(self._zeroed, stop)
        self._zero_from = None

    def _fdatasync(self, fd: int) -> float:
        """fdatasync ``fd``; its duration in seconds (returned, never shared: this runs on
        the fsync thread, and the loop is handed the figure)."""
        failpoints.hit("journal.before_fsync.kill")
        failpoints.hit("journal.fsync.eio")
        failpoints.hit("journal.fsync.hold")
        began = time.perf_counter()
        os.fdatasync(fd)
        seconds = time.perf_counter() - began
        self._still_named(fd)
        return seconds

    def _still_named(self, fd: int | None) -> None:
        """OSError if the open segment was unlinked (its data directory removed under
        rsd): every record in it, acknowledged or not, is gone with it at the stop, so
        nothing more may be acknowledged. One fstat per batch and per fsync."""
        if fd is not None and os.fstat(fd).st_nlink == 0:
            raise OSError(errno.ENOENT, f"segment {segment_name(self.seq)} was deleted "
                          f"(was the data directory {self.dir} removed?)")

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
        if self._thread is None:
            self._thread = _SyncThread(asyncio.get_running_loop())
        fd = self._fd
        assert fd is not None
        self.unsynced = False

        def finished(seconds: float, exc: BaseException | None) -> None:
            if exc is not None:
                fatal(f"journal fsync failed: {exc}")
            self.stats["fsyncs"] += 1
            self.on_fsync(seconds)
            failpoints.hit("journal.after_fsync.kill")
            done()

        self._thread.submit(lambda: self._fdatasync(fd), finished)
        if (self.preallocate and self._zero_from is None
                and self._zeroed - self._end < PREALLOCATE_BYTES // 2):
            # Zeros ahead, written after this fdatasync on the same thread: never over a
            # record (a write reaching ``start`` first waits for them: ``write``). They
            # start at least half a chunk past the records, so only a batch that large
            # ever waits (a new segment's first half chunk is written unpreallocated).
            start = max(self._zeroed, self._end + PREALLOCATE_BYTES // 2)
            stop = start + PREALLOCATE_BYTES
            self._zeroing.acquire()
            self._zero_from = start
            seq = self.seq
            self._thread.submit(lambda: self._zero(fd, start, stop),
                                lambda _, __: self._zeroed_up_to(seq, stop))

    def rotate(self) -> int:
        """fsync and close this segment, start the next; returns the seq of the closed one.

        Call only between batches, with no fsync in flight. Fatal if the next segment
        cannot be started.
        """
        self.sync_now()
        closed = self.seq
        assert self._fd is not None
        self._cut_zeros()
        os.close(self._fd)
        self._fd = None
        self.seq += 1
        try:
            self._fd = self._open_segment()
        except OSError as exc:
            fatal(f"cannot start journal segment {self.seq}: {exc}")
        return closed

    def _cut_zeros(self) -> None:
        """Cut the open segment back to its records (its zeros ahead are no longer
        needed), after the zeroing in progress if any. Fatal if that fails."""
        assert self._fd is not None
        if self._zero_from is not None:
            self._wait_for_zeros()
        self._zero_from = None  # (the loop may not yet know of zeros just written: fstat)
        try:
            if os.fstat(self._fd).st_size > self._end:
                os.ftruncate(self._fd, self._end)
                os.fsync(self._fd)
        except OSError as exc:
            fatal(f"journal fsync failed: {exc}")
        self._zeroed = self._end

    def close(self) -> None:
        """A clean stop: CLEAN_SHUTDOWN, fsync, close."""
        if self._fd is None:
            return
        self.write([CleanShutdown(Rec.CLEAN_SHUTDOWN, time.time())])
        self.sync_now()
        self._cut_zeros()
        os.close(self._fd)
        self._fd = None
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
