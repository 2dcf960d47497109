"""Recovery: read the data directory and yield the records it holds, for one caller to apply.

``Recovery(directory).records()`` yields the newest snapshot's records, then those of
every later segment, in file order; it never touches a core. Afterwards ``report`` says
what was read and found, and ``mend()`` brings the files in line with what was used.
startup.py is the caller: it applies the records and acts on the report.

What always holds:
- only the newest snapshot counts (the segments older ones cover are gone), and only
  segments after it are read; a damaged snapshot is refused, unless ``repair``, and
  one whose header is unreadable is refused even then;
- a torn tail of the last segment (a crash cut its last write) is warned about, naming
  file and offset, and cut off by ``mend``; a last segment whose header was cut short
  by a crash is removed by ``mend``; zeros after the last segment's last frame (the
  journal preallocates ahead of its writes) are its end: cut off by ``mend``, no warning,
  and the stop is no less clean for them;
- damage anywhere else refuses to start (RecoveryError naming file and offset) unless
  ``repair``: then the longest valid prefix is used, and ``mend`` sets the damaged
  files aside as ``*.damaged`` and puts the prefix back in place;
- reading changes no file but the removal of unfinished snapshots (``*.tmp``, never
  renamed, so never used); every other change waits for ``mend``;
- records are yielded frame by frame as they are decoded (the caller applies each
  before the next frame is decoded), so the decoded records of a whole file never exist
  at once: recovery's peak memory is the rebuilt state plus one frame, not plus the file;
- records are yielded in today's layouts: those of files older than format version 3
  go through ``core.upgrade.upgrade`` (their objects belong to the default tenant).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import Rec
from ..core.upgrade import RECORDS_VERSION, upgrade
from .datadir import segments, snapshots
from .logfile import JOURNAL_MAGIC, SNAPSHOT_MAGIC, FileDamaged, HeaderCutShort, frames

__all__ = ["Recovery", "RecoveryError", "RecoveryReport"]

log = logging.getLogger("rsd.disk.journal")


class RecoveryError(Exception):
    pass


@dataclass
class RecoveryReport:
    snapshot: str | None = None  # the snapshot used (after a repair: the one written)
    snapshot_records: int = 0
    segments: int = 0
    records: int = 0
    clean: bool = True  # the last stop was clean: the journal ends with CLEAN_SHUTDOWN
    truncated: str | None = None  # where a torn tail or damage was cut off
    seconds: float = 0.0
    repaired: bool = False  # records after damage were dropped (``repair``)
    covers: int = 0  # the last segment the snapshot used covers
    next_seq: int = 1  # the first segment number no file has used


class Recovery:
    def __init__(self, directory: Path, repair: bool = False) -> None:
        self.dir = Path(directory)
        self.repair = repair
        self.report = RecoveryReport()
        names = sorted(os.listdir(self.dir))
        for name in names:
            if name.endswith(".tmp"):
                (self.dir / name).unlink()  # an unfinished snapshot: never renamed, so unused
        self._snapshots = snapshots(names)
        self._segments = segments(names)
        self._torn: tuple[Path, int] | None = None  # (segment, good end) to truncate
        self._damaged: tuple[Path, int, list[str]] | None = None  # (segment, end, later)
        self._damaged_snapshot: Path | None = None
        self._header_cut: Path | None = None

    def records(self) -> Iterator[tuple[Any, ...]]:
        """Every record to apply, in order. Raises RecoveryError on damage it cannot use."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[Any]]:
        """Every record to apply, in order, a list per frame read (what ``records``
        yields one by one; the caller's loop is cheaper over these). Raises
        RecoveryError on damage it cannot use."""
        report = self.report
        if self._snapshots:
            report.covers, name = self._snapshots[-1]
            yield from self._snapshot_batches(self.dir / name)
            report.snapshot = name
        last_kind = None
        live = [(seq, name) for seq, name in self._segments if seq > report.covers]
        for index, (_, name) in enumerate(live):
            path = self.dir / name
            try:
                result, batches = frames(path, JOURNAL_MAGIC)
            except FileDamaged as exc:
                if index == len(live) - 1 and isinstance(exc, HeaderCutShort):
                    log.warning("%s: header cut short by a crash; removing it", name)
                    self._header_cut = path
                    continue
                raise RecoveryError(str(exc)) from None
            old = result.version < RECORDS_VERSION
            for batch in batches:  # applied frame by frame, as it is decoded
                if old:
                    batch = [upgrade(rec, result.version) for rec in batch]
                yield batch
                last_kind = batch[-1][0]
                report.records += len(batch)
            report.segments += 1
            if result.damage is None:
                continue
            where = f"{path} at offset {result.damage_at}: {result.damage}"
            if result.zero_tail and index == len(live) - 1:
                self._torn = (path, result.good_end)  # the zeros written ahead: the end
            elif result.torn_tail and index == len(live) - 1:
                log.warning("torn tail in %s; truncating to the last whole record", where)
                report.truncated = where
                self._torn = (path, result.good_end)
            elif self.repair:
                log.warning("damage in %s; --repair keeps the valid prefix", where)
                report.truncated = where
                report.repaired = True
                self._damaged = (path, result.good_end, [n for _, n in live[index + 1 :]])
                break
            else:
                raise RecoveryError(
                    f"damaged record in {where}; refusing to start (records after it "
                    "are intact, so this is not a torn write). Start with --repair to "
                    "keep the longest valid prefix."
                )
        report.clean = last_kind == Rec.CLEAN_SHUTDOWN if live else report.snapshot is None
        if not self._segments and not self._snapshots:
            report.clean = True  # a new data directory
        if report.repaired:
            report.clean = False
        report.next_seq = max([report.covers, *(seq for seq, _ in self._segments)]) + 1

    def _snapshot_batches(self, path: Path) -> Iterator[list[Any]]:
        """The snapshot's records, a list per frame as it is decoded (the last record
        held back: it must be the end record counting all the others). Damage found
        after some were yielded still refuses to start (RecoveryError; the core they went
        to is thrown away) unless ``repair``, which keeps them."""
        try:
            snap, batches = frames(path, SNAPSHOT_MAGIC)
        except FileDamaged as exc:
            raise RecoveryError(
                f"snapshot {exc}; nothing of it can be trusted, not even with --repair"
            ) from None
        old = snap.version < RECORDS_VERSION
        count = 0
        held: Any = None  # the last record read: the end record if the file is whole
        for batch in batches:
            if old:
                batch = [upgrade(rec, snap.version) for rec in batch]
            out = batch[:-1]
            if held is not None:
                out.insert(0, held)
            held = batch[-1]
            if out:
                count += len(out)
                yield out
        complete = held is not None and held[0] == Rec.SNAPSHOT_END and held[1] == count
        if snap.damage is not None or not complete:
            where = (
                f"{path} at offset {snap.damage_at}: {snap.damage}"
                if snap.damage is not None else f"{path}: no valid end record"
            )
            if not self.repair:
                raise RecoveryError(
                    f"damaged snapshot {where}; start with --repair to keep what of it "
                    "is readable (everything it held after the damage is lost)"
                )
            log.warning("damaged snapshot %s; --repair keeps its readable part", where)
            self.report.truncated = where
            self.report.repaired = True
            self._damaged_snapshot = path
        if held is not None and not complete:
            yield [held]
            count += 1
        self.report.snapshot_records = count

    def mend(self) -> None:
        """Make the files agree with the records used: cut a torn tail off, remove a
        segment with a cut-short header, set damaged files aside (``*.damaged``)."""
        if self._header_cut is not None:
            self._header_cut.unlink()
        if self._torn is not None:
            path, size = self._torn
            with open(path, "r+b") as f:
                f.truncate(size)
                f.flush()
                os.fsync(f.fileno())
        if self._damaged is not None:
            path, size, later = self._damaged
            damaged = self.dir / f"{path.name}.damaged"
            os.replace(path, damaged)
            with open(damaged, "rb") as src, open(path, "wb") as dst:
                dst.write(src.read(size))
                dst.flush()
                os.fsync(dst.fileno())
            for name in later:
                os.replace(self.dir / name, self.dir / f"{name}.damaged")
        if self._damaged_snapshot is not None:
            snap = self._damaged_snapshot
            os.replace(snap, snap.with_name(snap.name + ".damaged"))
