"""Fence writes to files with the lease's generation: a file is replaced only if the
generation stored beside it is not newer, by an atomic rename.

    make run                                   # rsd on 127.0.0.1:7420
    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/fencing_files.py

Each data file ``NAME`` has ``NAME.generation`` beside it. A writer writes to a temporary
file, checks the stored generation, and renames over the old files (``os.replace`` is
atomic), under a lock file so that check and rename are one step among writers on this
machine. A late writer whose lease ended holds an older generation and is refused.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import tempfile
from pathlib import Path

from rsclient import AsyncRunstate, Lease


def fenced_write(path: Path, text: str, lease: Lease) -> bool:
    """Replace ``path`` with ``text`` unless a newer owner already wrote it."""
    stamp = path.with_name(path.name + ".generation")
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # check-then-rename as one step
        stored = int(stamp.read_text()) if stamp.exists() else 0
        if stored > lease.generation:
            return False
        for target, content in ((path, text), (stamp, str(lease.generation))):
            fd, tmp = tempfile.mkstemp(dir=path.parent)
            with os.fdopen(fd, "w") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)  # atomic: readers see the old file or the new one
        return True


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.md"
        async with AsyncRunstate(holder="writer-old") as old, \
                AsyncRunstate(holder="writer-new") as new:
            run = await old.scopes.create()
            first = await run.claim("file:report.md", lease_seconds=5).acquire()
            print("old owner writes:", fenced_write(report, "draft", first))
            await first.release()  # in life: its lease expires while it is paused
            second = await new.scope(run.id).claim("file:report.md").acquire()
            print("new owner writes:", fenced_write(report, "final", second))
            print("late write from the old owner:", fenced_write(report, "stale", first))
            print("old token current:", await new.fence.check(run, "file:report.md",
                                                               first.token()))
            print("file holds:", report.read_text())
            await second.release()


if __name__ == "__main__":
    asyncio.run(main())
