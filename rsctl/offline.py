"""``rsctl journal verify DIR`` and ``rsctl journal dump DIR``: read a data directory
without a server, with rsd's own file reader (rsd/disk/logfile.py's ``scan``).

What always holds: nothing in the directory is changed (unlike recovery, which removes
unfinished snapshots and cuts torn tails: this is for looking, also beside a running
rsd). ``verify`` reads every snapshot and segment and exits with a status a script can
act on:
- 0: every file is whole;
- 1: the last segment ends in a torn tail (a crash cut its last write): rsd cuts it
  off at its next start and loses nothing that was acknowledged;
- 2: damage rsd will not start over without ``--repair`` (a bad header, a damaged
  frame with valid frames after it, a torn tail in a segment that is not the last, a
  damaged snapshot), or no data directory at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rsd.core import Rec
from rsd.core.records import fields_of
from rsd.disk.datadir import segments, snapshots
from rsd.disk.logfile import JOURNAL_MAGIC, SNAPSHOT_MAGIC, FileDamaged, scan

from .render import counted, print_json, print_table

__all__ = ["dump", "verify"]

FILE_COLUMNS = ("file", "kind", "seq", "version", "records", "bytes", "status", "detail")
_NAMES = {int(rec): rec.name for rec in Rec}


def _files(directory: Path) -> list[tuple[str, str, bytes]]:
    """(name, kind, magic) of the snapshots then the segments, each in sequence order."""
    names = os.listdir(directory)
    return [
        *((name, "snapshot", SNAPSHOT_MAGIC) for _, name in snapshots(names)),
        *((name, "segment", JOURNAL_MAGIC) for _, name in segments(names)),
    ]


def _check(directory: Path) -> list[dict[str, Any]]:
    found = _files(directory)
    last_segment = max((n for n, kind, _ in found if kind == "segment"), default=None)
    rows = []
    for name, kind, magic in found:
        row: dict[str, Any] = {"file": name, "kind": kind, "seq": None, "version": None,
                               "records": 0, "bytes": (directory / name).stat().st_size,
                               "status": "ok", "detail": None, "exit": 0}
        try:
            result = scan(directory / name, magic)
        except FileDamaged as exc:
            row.update(status="bad header", detail=str(exc), exit=2)
            rows.append(row)
            continue
        row.update(seq=result.seq, version=result.version, records=len(result.records))
        if result.zero_tail and name == last_segment:  # rsd's zeros written ahead
            row.update(detail=f"{row['bytes'] - result.good_end} bytes of zeros after the "
                       "last record (preallocated)")
        elif result.damage is not None:
            where = f"offset {result.damage_at}: {result.damage}"
            if result.torn_tail and name == last_segment:
                row.update(status="torn tail", exit=1,
                           detail=f"{where} ({row['bytes'] - result.good_end} bytes to cut)")
            else:
                row.update(status="damaged", exit=2, detail=where)
        rows.append(row)
    return rows


def verify(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"rsctl: {directory} is not a directory", file=sys.stderr)
        return 2
    rows = _check(directory)
    status = max((row["exit"] for row in rows), default=0)
    verdict = {0: "ok", 1: "torn tail (cut at next start)", 2: "damaged"}[status]
    if args.json:
        print_json({"dir": str(directory), "status": verdict, "exit": status, "files": rows})
    else:
        print_table(rows, FILE_COLUMNS)
        print(f"{counted(len(rows), 'file')}: {verdict}")
    return status


def dump(args: argparse.Namespace) -> int:
    """Every record, snapshot first, then the segments in order: a line each (``--json``:
    one JSON array per line, the record type's name first)."""
    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"rsctl: {directory} is not a directory", file=sys.stderr)
        return 2
    status = 0
    for name, _, magic in _files(directory):
        try:
            result = scan(directory / name, magic)
        except FileDamaged as exc:
            print(f"# {name}: {exc}", file=sys.stderr if args.json else sys.stdout)
            status = 2
            continue
        if not args.json:
            print(f"# {name}: {counted(len(result.records), 'record')}")
        for rec in result.records:
            kind = _NAMES.get(rec[0], str(rec[0]))
            if args.json:
                print_json([name, kind, *rec[1:]], line=True)
            else:
                names = fields_of(rec[0])[1:]
                print(kind, *(
                    f"{names[at]}={_short(value)}" if at < len(names) else _short(value)
                    for at, value in enumerate(rec[1:])
                ))
        if result.damage is not None and not result.zero_tail:
            print(f"# {name}: reading stopped at offset {result.damage_at}: {result.damage}",
                  file=sys.stderr if args.json else sys.stdout)
            status = max(status, 1 if result.torn_tail else 2)
    return status


def _short(value: Any) -> str:
    if isinstance(value, bytes):
        return value.hex()
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
