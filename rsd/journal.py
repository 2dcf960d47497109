"""Durability: the append-only journal, snapshots, and recovery at start.

Files in the data directory:
- ``journal-<seq>.log``: segments of records (see logfile.py), written in order; the
  one with the highest seq is being appended to;
- ``snapshot-<seq>.snap``: the whole live state as records, covering every segment up
  to and including ``<seq>``; written by a forked child to ``.tmp``, fsynced, renamed,
  and the directory fsynced, before the segments it covers are deleted;
- ``LOCK`` (see datadir.py).

What always holds:
- a record is written before the replies of its batch are released, and under
  ``always`` (and for any batch that asks for it) it is also fsynced first; the server
  (server.py) holds the replies until then;
- a write or fsync that fails is fatal: rsd exits non-zero at once and never sends the
  replies that depended on it (after a failed fsync the page cache cannot be trusted);
- recovery = newest valid snapshot + every later segment, through ``Core.apply``;
  a torn tail of the last segment is cut off with a warning naming file and offset;
  damage anywhere else refuses to start, naming file and offset, unless ``repair``;
- the journal ends with CLEAN_SHUTDOWN only after a clean stop; its absence tells the
  core that records may have been lost (see core/ids.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import failpoints
from .core import Core, Rec
from .logfile import (
    HEADER_BYTES,
    JOURNAL_MAGIC,
    SNAPSHOT_MAGIC,
    FileDamaged,
    encode_batch,
    file_header,
    fsync_dir,
    scan,
)

__all__ = ["POLICIES", "Journal", "RecoveryError", "RecoveryReport"]

log = logging.getLogger("rsd.journal")

POLICIES = ("always", "everysec", "no")
EXIT_IO_ERROR = 74  # EX_IOERR
_SEGMENT = re.compile(r"^journal-([0-9a-f]{16})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-([0-9a-f]{16})\.snap$")


class RecoveryError(Exception):
    pass


@dataclass
class RecoveryReport:
    snapshot: str | None = None
    snapshot_records: int = 0
    segments: int = 0
    records: int = 0
    clean: bool = True
    truncated: str | None = None
    seconds: float = 0.0


def _segment_name(seq: int) -> str:
    return f"journal-{seq:016x}.log"


def _snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:016x}.snap"


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


def fatal(message: str) -> None:
    """A write or fsync failed: the only safe move is to stop before acknowledging."""
    log.critical("%s; exiting without acknowledging unpersisted changes", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_IO_ERROR)


class Journal:
    def __init__(
        self,
        directory: Path,
        policy: str = "always",
        snapshot_bytes: int = 64 << 20,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fsync policy must be one of {POLICIES}")
        self.dir = Path(directory)
        self.policy = policy
        self.snapshot_bytes = snapshot_bytes
        self.seq = 0
        self._fd: int | None = None
        self.bytes_since_snapshot = 0
        self.unsynced = False  # bytes written since the last fsync
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.snapshot_pid: int | None = None
        self._snapshot_covers = 0
        self.stats: dict[str, float] = {
            "writes": 0, "fsyncs": 0, "records": 0, "snapshots": 0, "last_fork_ms": 0.0,
        }

    # ---- recovery ---------------------------------------------------------------------

    def recover(self, core: Core, now: float, repair: bool = False) -> RecoveryReport:
        """Rebuild ``core`` from disk and open a new segment to append to.

        The cyclic garbage collector is off meanwhile (millions of new objects would
        make it rescan the heap over and over) and the rebuilt state is frozen out of
        its reach afterwards: state is freed by reference counting, not by the GC.
        """
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._recover(core, now, repair)
        finally:
            gc.freeze()
            if enabled:
                gc.enable()

    def _recover(self, core: Core, now: float, repair: bool) -> RecoveryReport:
        started = time.perf_counter()
        report = RecoveryReport()
        names = sorted(os.listdir(self.dir))
        for name in names:
            if name.endswith(".tmp"):
                (self.dir / name).unlink()  # an unfinished snapshot: never renamed, so unused
        snapshots = sorted(
            (int(m.group(1), 16), n) for n in names if (m := _SNAPSHOT.match(n))
        )
        segments = sorted((int(m.group(1), 16), n) for n in names if (m := _SEGMENT.match(n)))
        covers = 0
        repaired = False
        damaged_snapshot: Path | None = None
        if snapshots:
            # Only the newest counts: the segments older ones cover are gone.
            covers, name = snapshots[-1]
            path = self.dir / name
            try:
                snap = scan(path, SNAPSHOT_MAGIC)
            except FileDamaged as exc:
                raise RecoveryError(
                    f"snapshot {exc}; nothing of it can be trusted, not even with --repair"
                ) from None
            records = snap.records
            complete = bool(records) and records[-1][0] == Rec.SNAPSHOT_END
            if snap.damage is not None or not complete or records[-1][1] != len(records) - 1:
                where = (
                    f"{path} at offset {snap.damage_at}: {snap.damage}"
                    if snap.damage is not None else f"{path}: no valid end record"
                )
                if not repair:
                    raise RecoveryError(
                        f"damaged snapshot {where}; start with --repair to keep what of it "
                        "is readable (everything it held after the damage is lost)"
                    )
                log.warning("damaged snapshot %s; --repair keeps its readable part", where)
                report.truncated = where
                repaired = True
                damaged_snapshot = path
            if complete:
                records = records[:-1]
            for rec in records:
                core.apply(rec, now)
            report.snapshot = name
            report.snapshot_records = len(records)
        last_kind = None
        live = [(seq, name) for seq, name in segments if seq > covers]
        for index, (_, name) in enumerate(live):
            path = self.dir / name
            try:
                result = scan(path, JOURNAL_MAGIC)
            except FileDamaged as exc:
                if index == len(live) - 1 and path.stat().st_size < HEADER_BYTES:
                    log.warning("%s: header cut short by a crash; removing it", name)
                    path.unlink()
                    continue
                raise RecoveryError(str(exc)) from None
            for rec in result.records:
                core.apply(rec, now)
                last_kind = rec[0]
            report.records += len(result.records)
            report.segments += 1
            if result.damage is None:
                continue
            where = f"{path} at offset {result.damage_at}: {result.damage}"
            if result.torn_tail and index == len(live) - 1:
                log.warning("torn tail in %s; truncating to the last whole record", where)
                report.truncated = where
                self._truncate(path, result.good_end)
            elif repair:
                log.warning("damage in %s; --repair keeps the valid prefix", where)
                report.truncated = where
                repaired = True
                os.replace(path, self.dir / f"{name}.damaged")
                self._rewrite_prefix(path, result.good_end)
                for _, later in live[index + 1 :]:
                    os.replace(self.dir / later, self.dir / f"{later}.damaged")
                break
            else:
                raise RecoveryError(
                    f"damaged record in {where}; refusing to start (records after it "
                    "are intact, so this is not a torn write). Start with --repair to "
                    "keep the longest valid prefix."
                )
        report.clean = last_kind == Rec.CLEAN_SHUTDOWN if live else report.snapshot is None
        if not segments and not snapshots:
            report.clean = True  # a new data directory
        self.seq = max([covers, *(seq for seq, _ in segments)]) + 1
        if repaired:
            # What was dropped may have handed out any id: jump past every id that could
            # ever have been issued (a counter cannot outgrow microseconds since 1970).
            report.clean = False
            core.reserve_ids_from(time.time_ns() // 1000)
            # Make the repaired state the new starting point: a complete snapshot of it,
            # so that the next start needs no --repair. Damaged files stay as *.damaged.
            if damaged_snapshot is not None:
                os.replace(damaged_snapshot, damaged_snapshot.with_name(
                    damaged_snapshot.name + ".damaged"
                ))
            covers = self.seq - 1
            self._write_snapshot(core, covers, os.getpid())
            report.snapshot = _snapshot_name(covers)
        self._delete_covered(covers, report.snapshot)
        self._open_segment()
        core.recovered(now, report.clean)
        report.seconds = time.perf_counter() - started
        return report

    def _rewrite_prefix(self, path: Path, size: int) -> None:
        """Write the valid prefix of a damaged segment (kept aside) back in its place."""
        damaged = self.dir / f"{path.name}.damaged"
        with open(damaged, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read(size))
            dst.flush()
            os.fsync(dst.fileno())

    @staticmethod
    def _truncate(path: Path, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    def _delete_covered(self, covers: int, keep_snapshot: str | None) -> None:
        for name in os.listdir(self.dir):
            seg = _SEGMENT.match(name)
            snap = _SNAPSHOT.match(name)
            if (seg and int(seg.group(1), 16) <= covers) or (snap and name != keep_snapshot):
                (self.dir / name).unlink()
        fsync_dir(self.dir)

    # ---- appending --------------------------------------------------------------------

    def _open_segment(self) -> None:
        path = self.dir / _segment_name(self.seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.write(fd, file_header(JOURNAL_MAGIC, self.seq))
        os.fsync(fd)
        fsync_dir(self.dir)
        self._fd = fd

    def write(self, records: list[tuple[Any, ...]]) -> None:
        """Append records (one write call). Fatal on failure."""
        if not records:
            return
        data = encode_batch(records)
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
        self.bytes_since_snapshot += len(data)
        self.unsynced = True

    def _fdatasync(self, fd: int) -> None:
        failpoints.hit("journal.before_fsync.kill")
        failpoints.hit("journal.fsync.eio")
        os.fdatasync(fd)

    def sync_now(self) -> None:
        """fdatasync on the caller's thread. Fatal on failure."""
        if self._fd is None or not self.unsynced:
            return
        self.unsynced = False
        try:
            self._fdatasync(self._fd)
        except OSError as exc:
            fatal(f"journal fsync failed: {exc}")
        self.stats["fsyncs"] += 1
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

        def finished(fut: asyncio.Future[None]) -> None:
            exc = fut.exception()
            if exc is not None:
                fatal(f"journal fsync failed: {exc}")
            self.stats["fsyncs"] += 1
            failpoints.hit("journal.after_fsync.kill")
            done()

        future.add_done_callback(finished)

    def close(self, core: Core | None = None) -> None:
        """A clean stop: CLEAN_SHUTDOWN, fsync, close."""
        if self._fd is None:
            return
        self.write([(Rec.CLEAN_SHUTDOWN, time.time())])
        self.sync_now()
        os.close(self._fd)
        self._fd = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    # ---- snapshots --------------------------------------------------------------------

    def snapshot_due(self) -> bool:
        return self.snapshot_pid is None and self.bytes_since_snapshot >= self.snapshot_bytes

    def start_snapshot(self, core: Core) -> int:
        """Fork a child that writes the live state; the journal moves to a new segment.

        The fork is the only pause the loop sees: the child has a copy-on-write image
        of the state as of the end of this segment and writes it at its own pace.
        Call only between batches, with no fsync in flight.
        """
        self.sync_now()
        covers = self.seq
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        self.seq += 1
        try:
            self._open_segment()
        except OSError as exc:
            fatal(f"cannot start journal segment {self.seq}: {exc}")
        self.bytes_since_snapshot = 0
        parent = os.getpid()
        gc.freeze()  # the child must not have the GC touch (and so copy) every page
        forked = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: write, and leave without running any of the parent's code
            code = 1
            try:
                gc.disable()
                _die_with_parent(parent)
                self._write_snapshot(core, covers, parent)
                code = 0
            finally:
                os._exit(code)
        pause_ms = (time.perf_counter() - forked) * 1000
        self.snapshot_pid = pid
        self._snapshot_covers = covers
        self.stats["snapshots"] += 1
        self.stats["last_fork_ms"] = round(pause_ms, 3)
        log.info("snapshot of segments up to %d started (fork paused %.1f ms)", covers, pause_ms)
        return pid

    def _write_snapshot(self, core: Core, covers: int, parent: int) -> None:
        final = self.dir / _snapshot_name(covers)
        tmp = final.with_name(final.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, file_header(SNAPSHOT_MAGIC, covers))
            batch: list[tuple[Any, ...]] = []
            count = 0
            for rec in core.snapshot():
                batch.append(rec)
                count += 1
                if len(batch) == 2000:
                    os.write(fd, encode_batch(batch))
                    batch.clear()
                    failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
            batch.append((Rec.SNAPSHOT_END, count))
            data = encode_batch(batch)
            half = len(data) // 2
            os.write(fd, data[:half])
            failpoints.hit("snapshot.mid.kill", pid_to_kill=parent)
            os.write(fd, data[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        fsync_dir(self.dir)

    def stop_snapshot(self) -> None:
        """At shutdown: end a snapshot writer still running (it must not hold the lock)."""
        pid, self.snapshot_pid = self.snapshot_pid, None
        if pid is not None:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def snapshot_finished(self, status: int) -> None:
        """The child exited: on success, delete what the snapshot covers."""
        self.snapshot_pid = None
        if os.waitstatus_to_exitcode(status) != 0:
            log.error("snapshot writer failed (status %s); the journal keeps everything", status)
            self.bytes_since_snapshot = self.snapshot_bytes  # try again at the next batch
            return
        failpoints.hit("snapshot.after_rename.kill")
        name = _snapshot_name(self._snapshot_covers)
        self._delete_covered(self._snapshot_covers, name)
        log.info("snapshot %s written; covered segments deleted", name)
