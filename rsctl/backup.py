"""``rsctl backup DIR``: a consistent copy of a running rsd's data directory, checked.

The copy is rsd's own: the server pins its newest snapshot and the journal after it
(BACKUP_BEGIN, rsd/disk/backups.py), rsctl reads them chunk by chunk (BACKUP_READ), so
the server never copies a file in its loop and serves every other client meanwhile.
First a snapshot is asked for (SNAPSHOT_NOW, unless ``--no-snapshot``), so the journal to
copy is short. Restoring is starting rsd on the copy (``rsd --data-dir DIR``): it
recovers as from a crash at the moment of BACKUP_BEGIN.

What always holds:
- ``DIR`` is new or empty (else exit 2 before anything is asked of the server), and the
  copy holds every change acknowledged before the command began;
- the files are written into ``DIR/.incomplete/``, each fsynced, and checked as
  recovery reads them (``rsd.disk.backups.check_copy``: every frame's salt, length and
  CRC, the snapshot's end record, no torn tail, no segment missing) before they are
  moved into ``DIR`` itself; a backup that fails leaves no file where rsd would read
  one (exit 1, the reason on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rsclient import AsyncRunstate
from rsclient.wire import Op
from rsd.disk.backups import check_copy
from rsd.disk.logfile import fsync_dir
from rsd.policy import Policy

from .render import counted, print_json

__all__ = ["STAGING", "add_parser", "backup", "unusable"]

STAGING = ".incomplete"  # the copy's files until they are checked
_IN_FLIGHT = 4  # BACKUP_READs pipelined on the connection


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    text = ("copy a running rsd's data (its latest snapshot and the journal after it) into "
            "DIR, new or empty, and check the copy; `rsd --data-dir DIR` restores it")
    cmd = sub.add_parser("backup", help=text, description=text, parents=[common])
    cmd.add_argument("dir")
    cmd.add_argument("--no-snapshot", action="store_true",
                     help="copy the latest snapshot and every segment after it, without "
                     "asking for a new snapshot first")


def unusable(target: Path) -> str | None:
    """Why ``target`` cannot take a backup (None: it can): it must be a directory that
    is new or empty, and writable (it is made, with its parents, if it is new)."""
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            return f"{target} exists and is not a directory"
        if any(target.iterdir()):
            return f"{target} is not empty: a backup goes into a new or empty directory"
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / STAGING
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot write to {target}: {exc.strerror or exc}"
    return None


async def backup(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    target = Path(args.dir)
    problem = unusable(target)
    if problem is not None:
        print(f"rsctl: {problem}", file=sys.stderr)
        return 2
    staging = target / STAGING
    staging.mkdir()
    try:
        pinned, total = await _take(rs, args, staging)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"rsctl: backup failed: {exc}; nothing was put in {target}", file=sys.stderr)
        return 1
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    problem = check_copy(staging, pinned["covers"])
    if problem is not None:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"rsctl: the copy does not read back whole ({problem}); nothing was put "
              f"in {target}", file=sys.stderr)
        return 1
    names = [file["name"] for file in pinned["files"]]
    for name in names:
        os.replace(staging / name, target / name)
    staging.rmdir()
    fsync_dir(target)
    summary = {"dir": str(target), "covers": pinned["covers"], "files": pinned["files"],
               "bytes": total}
    if args.json:
        print_json(summary)
    else:
        print(f"backup in {target}: {counted(len(names), 'file')} ({', '.join(names)}), "
              f"{total} bytes, checked; restore with: rsd --data-dir {target}")
    return 0


async def _take(
    rs: AsyncRunstate, args: argparse.Namespace, staging: Path
) -> tuple[dict[str, Any], int]:
    """Ask for a snapshot (unless ``--no-snapshot``), pin, copy every pinned file into
    ``staging``, unpin; what was pinned and the bytes copied."""
    if not args.no_snapshot:
        await rs.admin.snapshot()
    pinned = await rs.admin.request(Op.BACKUP_BEGIN)
    total = 0
    try:
        for file in pinned["files"]:
            total += await _copy(rs, staging, file["name"], file["length"])
    finally:
        await rs.admin.request(Op.BACKUP_END)
    fsync_dir(staging)
    return pinned, total


async def _copy(rs: AsyncRunstate, staging: Path, name: str, length: int) -> int:
    """Read ``name`` of the backup up to ``length`` into ``staging``, fsynced; the bytes
    written. A few reads are in flight at once, written in order as they come back."""
    offsets = iter(range(0, length, Policy.BACKUP_CHUNK_BYTES))
    written = 0
    with open(staging / name, "wb") as out:
        while True:
            batch = [offset for _, offset in zip(range(_IN_FLIGHT), offsets, strict=False)]
            if not batch:
                break
            replies = await asyncio.gather(*(
                rs.admin.request(Op.BACKUP_READ, file=name, offset=offset) for offset in batch))
            for offset, reply in zip(batch, replies, strict=True):
                data: bytes = reply["data"]
                if not data or offset != written:
                    raise OSError(f"{name}: the server answered no bytes at offset {offset} "
                                  f"of {length}")
                out.write(data)
                written += len(data)
        out.flush()
        os.fsync(out.fileno())
    if written != length:
        raise OSError(f"{name}: copied {written} bytes of {length}")
    return written

