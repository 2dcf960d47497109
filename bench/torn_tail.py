"""The torn-tail scan against frame-like task data: how long reading a journal segment
takes when its last write (task data made of bytes laid out as journal frames) was cut
short by a crash or a full disk.

    .venv/bin/python -m bench.torn_tail [--payloads 4000 8000] [--batch-bytes 1048576]
                                        [--reader PATH]

For each size it writes the segment in format version 2 (salted frames, what rsd
writes) and in format version 1 (what rsd wrote before salts, still read), cuts the
last write 5 bytes short of its end (the worst place for the version 1 search: every
frame-like payload chains on to the cut) and in its middle, and times ``scan``. Each
line gives the seconds, the verdict (torn tail or damage: a torn tail is right) and
how many offsets were checked as frame starts after the damage.

- ``--payloads N``: one task whose data is N frame-like records (version 1 frames of
  19 bytes, as the attack that made rsd refuse to start).
- ``--batch-bytes B``: one write (one frame, B at most 1 MiB) of about B bytes made
  of tasks of up to 256 KiB (the largest payload a client may send) of frame-like
  records.
- ``--reader PATH``: also time the version 1 file with another implementation of
  rsd/disk/logfile.py, for example the one before salts:
  ``git show 274a902:rsd/disk/logfile.py > /tmp/logfile_before.py`` (its ``scan`` takes the
  same arguments). It can take minutes: it was quadratic.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsd.core import Rec
from rsd.disk import logfile_v1
from rsd.disk.logfile import JOURNAL_MAGIC, encode_batch, file_header, new_salt, scan

PAYLOAD_BYTES = 256 * 1024


def forged(count: int) -> bytes:
    return b"".join(logfile_v1.encode_record([Rec.CLEAN_SHUTDOWN, 0.0]) for _ in range(count))


def task(i: int, data: bytes) -> list[Any]:
    return [Rec.ITEM_ENQUEUED, f"t-{i}", False, "s", "jobs", None, None, data, 1.0, None]


def last_write_records(payloads: int | None, batch_bytes: int | None) -> list[list[Any]]:
    if payloads is not None:
        return [task(0, forged(payloads))]
    assert batch_bytes is not None
    frame = len(forged(1))
    left = batch_bytes - 4096  # under the frame target: one frame in both formats
    tasks: list[list[Any]] = []
    while left > frame:
        size = min(PAYLOAD_BYTES, left)
        tasks.append(task(len(tasks), forged(size // frame)))
        left -= size
    return tasks


def segments(records: list[list[Any]]) -> dict[str, tuple[bytes, int]]:
    """Each format's segment bytes and where the last write starts."""
    before = [[Rec.ITEM_ENQUEUED, "t-early", False, "s", "jobs", None, None, b"x", 1.0, None]]
    salt = new_salt()
    v2 = file_header(JOURNAL_MAGIC, 1, salt) + encode_batch(before, salt)
    v1 = logfile_v1.file_header(JOURNAL_MAGIC, 1) + logfile_v1.encode_batch(before)
    return {
        "v2": (v2 + encode_batch(records, salt), len(v2)),
        "v1": (v1 + logfile_v1.encode_batch(records), len(v1)),
    }


def timed(reader: Callable[[Path, bytes], Any], path: Path) -> tuple[float, Any]:
    started = time.perf_counter()
    got = reader(path, JOURNAL_MAGIC)
    return time.perf_counter() - started, got


def run(
    label: str,
    records: list[list[Any]],
    other: Callable[[Path, bytes], Any] | None,
    wanted: list[str],
) -> None:
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as tmp:
        path = Path(tmp) / "journal-0000000000000001.log"
        for fmt, (data, last) in segments(records).items():
            readers: list[tuple[str, Callable[[Path, bytes], Any]]] = [("rsd", scan)]
            if other is not None and fmt == "v1":
                readers.append(("--reader", other))
            middle = (last + len(data)) // 2 + 7  # off any frame boundary
            cuts = {"end-5": len(data) - 5, "middle": middle}
            for where in wanted:
                cut = cuts[where]
                path.write_bytes(data[:cut])
                for name, reader in readers:
                    seconds, got = timed(reader, path)
                    verdict = "torn tail" if got.torn_tail else "DAMAGE (refused)"
                    if got.damage is None:
                        verdict = "whole frames"
                    checked = getattr(got, "candidates", "?")
                    print(f"{label:>22} {fmt} {where:>6} {name:>8}: {seconds:9.4f} s  "
                          f"{verdict:<16} candidates checked {checked}  "
                          f"({(len(data) - last) / 1e6:.2f} MB last write)", flush=True)


def load_reader(path: str) -> Callable[[Path, bytes], Any]:
    spec = importlib.util.spec_from_file_location("other_logfile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    reader: Callable[[Path, bytes], Any] = module.scan  # the file's own Scan
    return reader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payloads", type=int, nargs="*", default=[4000, 8000])
    parser.add_argument("--batch-bytes", type=int, nargs="*", default=[1 << 20])
    parser.add_argument("--reader", help="another rsd/disk/logfile.py to time on version 1 files")
    parser.add_argument("--cuts", nargs="*", default=["end-5", "middle"],
                        choices=["end-5", "middle"], help="where to cut the last write")
    args = parser.parse_args()
    other = load_reader(args.reader) if args.reader else None
    for count in args.payloads:
        run(f"{count} payload frames", last_write_records(count, None), other, args.cuts)
    for size in args.batch_bytes:
        run(f"{size / 2**20:g} MiB batch", last_write_records(None, size), other, args.cuts)


if __name__ == "__main__":
    main()
