"""Snapshots: the whole live state written by a forked child, then the segments it covers
deleted.

What always holds:
- ``snapshot-<seq>.snap`` covers every segment up to and including ``<seq>``: the journal
  moves to segment ``<seq> + 1`` right before the fork, so the child's copy-on-write
  image is the state as of the end of segment ``<seq>``;
- the file is written, read back whole and renamed into place (snapshotfile.py) before
  any segment it covers is deleted; an unfinished ``.tmp`` is never read (the writer
  removes it when it fails, recovery when the writer was killed);
- the fork is the only pause the loop sees, and it happens between batches with no fsync
  in flight (groupcommit.py decides when);
- the child dies with rsd, and a child still running at shutdown is killed: it must
  never outlive rsd holding the data directory's lock;
- a failed snapshot removes its temporary file, keeps every segment, is logged once and
  counted (``snapshot_failures``), and the next one due by size waits a backoff that
  grows with each failure in a row (``Policy.SNAPSHOT_RETRY_SECONDS`` doubling up to
  ``SNAPSHOT_RETRY_MAX_SECONDS``); a SNAPSHOT_NOW request still starts one at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable

from rsproto import ErrorCode

from ..collector import settle
from ..core import Core
from ..policy import Policy
from . import failpoints
from .datadir import snapshot_name
from .journal import Journal
from .snapshotfile import delete_covered, write_snapshot

__all__ = ["Snapshots"]


def _nothing() -> None:
    """The default ``Snapshots.wake``: a snapshot without a server has nobody to answer."""

log = logging.getLogger("rsd.disk.journal")


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


_WHY_BYTES = 512  # the longest reason a failed child reports (under PIPE_BUF: atomic)


def _pipe() -> tuple[int | None, int | None]:
    """A pipe for the child's reason, or none if no descriptor is left (it then fails
    without saying why; the exit code still tells the failure)."""
    try:
        read, write = os.pipe()
    except OSError:
        return None, None
    os.set_blocking(read, False)
    return read, write


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
        self._mark_before = self._mark  # the mark before the running snapshot started
        self._covers = 0
        self.stats: dict[str, float] = {
            "snapshots": 0, "last_fork_ms": 0.0, "snapshot_failures": 0,
        }
        # After a failure: no snapshot due by size before ``_retry_at`` (monotonic), and
        # the wait after the next failure. Both reset by a snapshot written.
        self._retry_at = 0.0
        self._backoff = Policy.SNAPSHOT_RETRY_SECONDS
        self.clock: Callable[[], float] = time.monotonic  # for the backoff (tests move it)
        self._why: int | None = None  # the read end of the running child's error pipe
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
        """Whether to start a snapshot now: one was asked for (SNAPSHOT_NOW: at once), or
        enough journal was written since the last one written and the wait after a
        failed one (growing, capped: ``failed``) is over."""
        if self.pid is not None:
            return False
        if self.asks:
            return True
        return self.bytes_since >= self.snapshot_bytes and self.clock() >= self._retry_at

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
        self._mark_before, self._mark = self._mark, self.journal.bytes_written
        self.answering, self.asks = self.asks, []
        parent = os.getpid()
        settle()  # the child must not have the GC touch (and so copy) every page
        why, tell = _pipe()  # the child says there why it failed (one short line)
        forked = self._began = time.perf_counter()
        try:
            pid = os.fork()
        except OSError:
            for fd in (why, tell):
                if fd is not None:
                    os.close(fd)
            raise
        if pid == 0:  # the child: write, and leave without running any of the parent's code
            code = 1
            try:
                gc.disable()
                _die_with_parent(parent)
                write_snapshot(self.journal.dir, self.core, covers, parent)
                code = 0
            except BaseException as exc:
                if tell is not None:
                    with contextlib.suppress(OSError):  # < PIPE_BUF: never blocks
                        os.write(tell, f"{type(exc).__name__}: {exc}".encode()[:_WHY_BYTES])
            finally:
                os._exit(code)
        if tell is not None:
            os.close(tell)
        self._why = why
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
        why = self._reason()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            self.failed(why or (f"exit code {code}" if code > 0 else f"signal {-code}"))
            return
        self._retry_at, self._backoff = 0.0, Policy.SNAPSHOT_RETRY_SECONDS
        failpoints.hit("snapshot.after_rename.kill")
        name = snapshot_name(self._covers)
        seconds = time.perf_counter() - self._began
        try:
            delete_covered(self.journal.dir, self._covers, name)
        except OSError as exc:
            # The snapshot is whole and in place, so it stands; what it covers is only
            # space, which the next snapshot's deletion (every covered file) gives back.
            log.error(
                "snapshot %s written, but its covered segments were not all deleted (%s); "
                "the next snapshot deletes them", name, exc,
                extra={"snapshot": name, "covers": self._covers, "error": str(exc)},
            )
        else:
            log.info(
                "snapshot %s written in %.3f s; covered segments deleted", name, seconds,
                extra={"snapshot": name, "covers": self._covers,
                       "seconds": round(seconds, 3)},
            )
        self.journal.measure()
        self._answer(True)
        if self.on_written is not None:
            self.on_written(seconds)

    def failed(self, why: str) -> None:
        """The snapshot writer failed (its temporary file is removed, no segment was
        deleted: the journal keeps everything). One log line, the failure counted, the
        requests waiting for it answered; the next one due by size waits ``_backoff``,
        which doubles with each failure in a row up to ``SNAPSHOT_RETRY_MAX_SECONDS``
        (a full disk is not emptied by trying again at once)."""
        self.stats["snapshot_failures"] += 1
        self._mark = self._mark_before  # the journal since the last snapshot written
        wait = self._backoff
        self._retry_at = self.clock() + wait
        self._backoff = min(wait * 2, Policy.SNAPSHOT_RETRY_MAX_SECONDS)
        log.error(
            "snapshot writer failed (%s); the journal keeps everything, next try in %g s",
            why, wait,
            extra={"snapshot": snapshot_name(self._covers), "covers": self._covers,
                   "error": why, "retry_seconds": wait},
        )
        self._answer(False)

    def _reason(self) -> str:
        """What the finished child wrote to its error pipe ("" if nothing); closes it.
        Never blocks the loop (the pipe's read end is non-blocking)."""
        fd, self._why = self._why, None
        if fd is None:
            return ""
        try:
            return os.read(fd, _WHY_BYTES).decode(errors="replace")
        except OSError:  # BlockingIOError included: nothing was written
            return ""
        finally:
            os.close(fd)

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
        self._reason()  # (closes the pipe; the writer is gone, so this never waits)
