"""Group commit in a cluster (groupcommit.py ``replicas``): a held batch leaves only once
an fsync that started after it was written has completed *and* the synchronous standby
acknowledged it, whatever leaves the front of the line meanwhile (batches released by
acks, or refused). The fsync's coverage is counted by batch numbers, not by positions in
the line, so batches released while an fsync runs do not make later ones look covered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rsd.disk.groupcommit import GroupCommit


class Journal:
    """Records writes; an fsync covers the writes made before it started, and ends when
    the test says."""

    policy = "always"

    def __init__(self) -> None:
        self.writes = 0
        self.durable = 0
        self.unsynced = False
        self.pending: tuple[int, Callable[[], None]] | None = None

    def write(self, records: list[Any]) -> None:
        self.writes += 1
        self.unsynced = True

    def sync_in_background(self, done: Callable[[], None]) -> None:
        self.pending = (self.writes, done)
        self.unsynced = False  # (as journal.py: a write during the fsync sets it again)

    def finish(self) -> None:
        assert self.pending is not None
        covered, done = self.pending
        self.pending = None
        self.durable = covered
        done()


class Snapshots:
    def due(self) -> bool:
        return False


class Replicas:
    written = -1
    sync_acked = -1


async def test_batches_released_during_an_fsync_do_not_make_later_ones_look_fsynced() -> None:
    loop = asyncio.get_running_loop()
    journal, replicas = Journal(), Replicas()
    sent: list[tuple[bytes, int]] = []
    commit: GroupCommit[str] = GroupCommit(
        journal, Snapshots(), loop,  # type: ignore[arg-type]
        lambda conn, data: sent.append((data, journal.durable)), replicas=replicas,
    )

    def turn(name: str) -> None:  # one flush: journal write, publish, hold its replies
        journal.write([name])
        replicas.written += 1
        commit.hold([("client", name.encode())])

    turn("b0")
    journal.finish()  # b0 fsynced; it waits for the standby
    turn("b1")  # an fsync starts: it covers writes 0 and 1
    replicas.sync_acked = 0
    commit.acked()  # b0 released, leaving the front while that fsync runs
    turn("b2")  # written after that fsync started: not covered by it
    replicas.sync_acked = 2
    commit.acked()  # the standby holds b1 and b2
    journal.finish()  # the fsync of writes 0..1 ends: b1 may leave, b2 may not
    assert [data for data, _ in sent] == [b"b0", b"b1"]
    for data, durable in sent:
        assert durable >= int(data[1:]) + 1, f"{data!r} left before its own fsync"
    journal.finish()  # the next fsync (started when the last ended) covers b2
    assert [data for data, _ in sent] == [b"b0", b"b1", b"b2"]


async def test_an_http_action_is_told_done_with_the_batches_held_before_it() -> None:
    """``after_held`` (an HTTP action's answer, api.py): told True once every batch held
    when it asked has left, at once if none was held, False if one was refused."""
    loop = asyncio.get_running_loop()
    journal, replicas = Journal(), Replicas()
    sent: list[bytes] = []
    refused: list[int] = []
    commit: GroupCommit[str] = GroupCommit(
        journal, Snapshots(), loop,  # type: ignore[arg-type]
        lambda conn, data: sent.append(data), replicas=replicas,
        refuse=lambda conn, size: refused.append(size), sync_wait=0.05,
    )
    told: list[tuple[str, bool]] = []
    commit.after_held(lambda ok: told.append(("idle", ok)))
    assert told == [("idle", True)]  # nothing held: at once

    journal.write(["b0"])
    replicas.written += 1
    commit.hold([("client", b"b0")])
    commit.after_held(lambda ok: told.append(("b0", ok)))
    journal.finish()
    assert told == [("idle", True)]  # fsynced, but the standby has not acknowledged
    replicas.sync_acked = 0
    commit.acked()
    assert sent == [b"b0"] and told[-1] == ("b0", True)

    journal.write(["b1"])
    replicas.written += 1
    commit.hold([("client", b"b1")])
    commit.after_held(lambda ok: told.append(("b1", ok)))
    journal.finish()  # no standby ever acknowledges b1: refused after sync_wait
    for _ in range(100):
        if len(told) == 3:
            break
        await asyncio.sleep(0.02)
    assert told[-1] == ("b1", False) and refused == [2]
