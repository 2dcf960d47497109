"""Fence writes to SQLite with the lease's generation: a late write from an owner whose
lease ended is refused by the database itself, and rs.fence.check says so too.

    make run                                   # rsd on 127.0.0.1:7420
    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/fencing_sqlite.py

The pattern: every write carries the writer's ``lease.generation`` and is a conditional
UPDATE that only applies if the stored generation is not newer. Generations of a key
only grow with each new owner, so once a newer owner has written, an older one can
never overwrite it, however late its write arrives.
"""

from __future__ import annotations

import asyncio
import sqlite3

from rsclient import AsyncRunstate, Lease

SCHEMA = "CREATE TABLE IF NOT EXISTS reports (id TEXT PRIMARY KEY, value TEXT, generation INTEGER)"


def fenced_write(db: sqlite3.Connection, row: str, value: str, lease: Lease) -> bool:
    """Write ``value`` to ``row`` unless a newer owner already wrote it. True if written."""
    db.execute("INSERT OR IGNORE INTO reports (id, value, generation) VALUES (?, '', 0)", (row,))
    cursor = db.execute(
        "UPDATE reports SET value = ?, generation = ? WHERE id = ? AND generation <= ?",
        (value, lease.generation, row, lease.generation),
    )
    db.commit()
    return cursor.rowcount == 1


async def main() -> None:
    db = sqlite3.connect(":memory:")
    db.execute(SCHEMA)
    async with AsyncRunstate(holder="writer-old") as old, \
            AsyncRunstate(holder="writer-new") as new:
        run = await old.scopes.create(id=f"fencing-sqlite-{id(db)}")
        first = await run.claim("report:acme", lease_seconds=5).acquire()
        print("old owner writes:", fenced_write(db, "acme", "draft", first))
        # The old owner's lease ends (here it is released; in life it expires while the
        # process is paused) and another worker takes the key over.
        token = first.token()
        await first.release()
        second = await new.scope(run.id).claim("report:acme").acquire()
        print("new owner writes:", fenced_write(db, "acme", "final", second))
        print("old token current:", await new.fence.check(run, "report:acme", token))
        print("new token current:", await new.fence.check(run, "report:acme", second.token()))
        # The paused old owner wakes up and writes late: the database refuses it.
        print("late write from the old owner:", fenced_write(db, "acme", "stale", first))
        print("stored:", db.execute("SELECT value, generation FROM reports").fetchone()[0])
        await second.release()


if __name__ == "__main__":
    asyncio.run(main())
