"""Snapshots: the whole live state written by a forked child, then the segments it covers
deleted.

What always holds:
- ``snapshot-<seq>.snap`` covers every segment up to and including ``<seq>``: the journal
  moves to segment ``<seq> + 1`` right before the fork, so the child's copy-on-write
  image is the state as of the end of segment ``<seq>``;
- the file is written to ``.tmp``, fsynced, renamed and the directory fsynced before any
  segment it covers is deleted; an unfinished ``.tmp`` is never read (recovery removes it);
- the file has a salt of its own (logfile.py), drawn by the process that writes it;
- the fork is the only pause the loop sees, and it happens between batches with no fsync
  in flight (groupcommit.py decides when);
- the child dies with rsd, and a child still running at shutdown is killed: it must
  never outlive rsd holding the data directory's lock;
- a failed snapshot keeps every segment and is tried again at the next batch.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsproto import ErrorCode

from . import failpoints
from .collector import settle
from .core import Core, Rec
from .datadir import segments, snapshot_name, snapshots
from .journal import Journal
from .logfile import SNAPSHOT_MAGIC, encode_batch, file_header, fsync_dir, new_salt
from .policy import Policy

__all__ = ["Snapshots", "delete_covered", "write_snapshot"]


def _nothing() -> None:
    """The default ``Snapshots.wake``: a snapshot without a server has nobody to answer."""

log = logging.getLogger("rsd.journal")


def write_snapshot(directory: Path, core: Core, covers: int, parent: int) -> None:
    """Write ``core``'s live state as the snapshot covering segments up to ``covers``."""
    final = directory / snapshot_name(covers)
    tmp = final.with_name(final.name + ".tmp")
    salt = new_salt()  # by the writing process (the forked child): never the journal's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, file_header(SNAPSHOT_MAGIC, covers, salt))
        batch: list[tuple[Any, ...]] = []
        count = 0
        for rec in core.snapshot():
            batch.append(rec)
            count += 1
            if len(batch) == 2000:
                os.write(fd, encode_batch(batch, salt))
                batch.clear()
                failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
        batch.append((Rec.SNAPSHOT_END, count))
        data = encode_batch(batch, salt)
        half = len(data) // 2
        os.write(fd, data[:half])
        failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
        os.write(fd, data[half:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(directory)


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


def _die_with_parent(parent: int) -> None:
    """Make the snapshot child die with rsd: it must not outlive it holding the lock."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):  # not Linux: the child just finishes its file
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


class Snapshots:
    """Snapshots of ``core`` taken while ``journal`` appends, one at a time."""

    def __init__(
        self, journal: Journal, core: Core, snapshot_bytes: int = Policy.SNAPSHOT_BYTES
    ) -> None:
        self.journal = journal
        self.core = core
        self.snapshot_bytes = snapshot_bytes
        self.pid: int | None = None  # the child writing a snapshot, if one is running
        self._mark = journal.bytes_written  # where "journal written since" counts from
        self._covers = 0
        self.stats: dict[str, float] = {"snapshots": 0, "last_fork_ms": 0.0}
        # SNAPSHOT_NOW requests (connection id, request id): those waiting for the next
        # snapshot to start, and those the running one answers when it is written.
        self.asks: list[tuple[int, int]] = []
        self.answering: list[tuple[int, int]] = []
        self.wake: Callable[[], None] = _nothing  # the server's flush: sends the answers
        self._began = 0.0  # perf_counter at the fork of the running snapshot
        # Called with a written snapshot's duration, fork to rename, in seconds (metrics).
        self.on_written: Callable[[float], None] | None = None

    @property
    def bytes_since(self) -> int:
        """Journal bytes written since the last snapshot started."""
        return self.journal.bytes_written - self._mark

    def due(self) -> bool:
        return self.pid is None and (bool(self.asks) or self.bytes_since >= self.snapshot_bytes)

    def ask(self, conn: int, rid: int) -> None:
        """A SNAPSHOT_NOW request: answered once a snapshot started after it is written
        (its file renamed into place and fsynced, the segments it covers deleted). At most
        ``Policy.MAX_SNAPSHOT_WAITERS`` wait; beyond, RESOURCE_EXHAUSTED at once."""
        effects = self.core.effects
        if len(self.asks) + len(self.answering) >= Policy.MAX_SNAPSHOT_WAITERS:
            effects.error(
                conn, rid, ErrorCode.RESOURCE_EXHAUSTED,
                f"{Policy.MAX_SNAPSHOT_WAITERS} snapshot requests are already waiting "
                "(max_snapshot_waiters); retry once they are answered",
            )
            return
        self.asks.append((conn, rid))

    def _answer(self, ok: bool) -> None:
        """Answer the requests the snapshot that just ended was taken for."""
        answering, self.answering = self.answering, []
        effects = self.core.effects
        name = snapshot_name(self._covers)
        for conn, rid in answering:
            if ok:
                effects.reply(conn, rid, {"snapshot": name, "covers": self._covers})
            else:
                effects.error(
                    conn, rid, ErrorCode.INTERNAL,
                    "the snapshot writer failed (the server log says why); the journal "
                    "keeps everything",
                )
        if answering or self.asks:
            self.wake()  # send the answers; start the next snapshot if one was asked for

    def start(self) -> int:
        """Fork a child that writes the live state; the journal moves to a new segment.

        Call only between batches, with no fsync in flight: the rotation fsyncs, so
        every record written so far is on disk when this returns.
        """
        covers = self.journal.rotate()
        self._mark = self.journal.bytes_written
        self.answering, self.asks = self.asks, []
        parent = os.getpid()
        settle()  # the child must not have the GC touch (and so copy) every page
        forked = self._began = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: write, and leave without running any of the parent's code
            code = 1
            try:
                gc.disable()
                _die_with_parent(parent)
                write_snapshot(self.journal.dir, self.core, covers, parent)
                code = 0
            finally:
                os._exit(code)
        pause_ms = (time.perf_counter() - forked) * 1000
        self.pid = pid
        self._covers = covers
        self.stats["snapshots"] += 1
        self.stats["last_fork_ms"] = round(pause_ms, 3)
        log.info(
            "snapshot of segments up to %d started (fork paused %.1f ms)", covers, pause_ms,
            extra={"snapshot": snapshot_name(covers), "covers": covers, "writer_pid": pid},
        )
        return pid

    def watch(self, loop: asyncio.AbstractEventLoop, pid: int) -> None:
        """Call ``finished`` from ``loop`` when the child ``pid`` exits (unless ``stop``
        reaped it first)."""
        pidfd = os.pidfd_open(pid)

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if self.pid != pid:
                return  # already reaped (stop at shutdown)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                return
            self.finished(status)

        loop.add_reader(pidfd, exited)

    def finished(self, status: int) -> None:
        """The child exited with ``status``: on success, delete what the snapshot covers."""
        self.pid = None
        if os.waitstatus_to_exitcode(status) != 0:
            log.error(
                "snapshot writer failed (status %s); the journal keeps everything", status,
                extra={"snapshot": snapshot_name(self._covers), "covers": self._covers},
            )
            self._mark = self.journal.bytes_written - self.snapshot_bytes  # due at once
            self._answer(False)
            return
        failpoints.hit("snapshot.after_rename.kill")
        name = snapshot_name(self._covers)
        seconds = time.perf_counter() - self._began
        delete_covered(self.journal.dir, self._covers, name)
        self.journal.measure()
        log.info(
            "snapshot %s written in %.3f s; covered segments deleted", name, seconds,
            extra={"snapshot": name, "covers": self._covers, "seconds": round(seconds, 3)},
        )
        self._answer(True)
        if self.on_written is not None:
            self.on_written(seconds)

    def stop(self) -> None:
        """At shutdown: end a snapshot writer still running (it must not hold the lock)."""
        pid, self.pid = self.pid, None
        self.asks, self.answering = [], []  # their connections close with the server
        if pid is not None:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
