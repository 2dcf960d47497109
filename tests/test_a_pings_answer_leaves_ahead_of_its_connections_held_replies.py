"""A PING's answer is never held: it leaves at the flush of its own loop turn, ahead of
its connection's replies held for an fsync (or a synchronous standby), which keep their
order among themselves and leave only once durable (rsd/wire/output.py).

It reveals nothing, journaled or not, and replies are matched by request id
(protocol.md), so it need not wait: a client whose writes wait for a standby being
replaced still has its silence probe answered (on a real cluster: test_a_client_keeps_
its_primary_while_a_hung_standby_is_replaced.py). In-process, on recording transports,
with an fsync that ends when the test says: which bytes leave in which write is exact,
not timed. With nothing held, a PING's answer keeps its place among its turn's replies.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from support.shell import Shell, transport, turn

import rsproto as wire
from rsd.disk.groupcommit import GroupCommit
from rsd.wire.connection import Connection
from rsproto import Kind, Op

_rids = itertools.count(10)


class FsyncOnCue:
    """A journal under ``--fsync always`` whose fsync ends when the test says."""

    policy = "always"

    def __init__(self) -> None:
        self.writes = 0
        self.unsynced = False
        self.durable = 0  # writes an fsync has covered
        self.running: tuple[int, Callable[[], None]] | None = None

    def write(self, records: list[Any]) -> None:
        self.writes += 1
        self.unsynced = True

    def sync_in_background(self, done: Callable[[], None]) -> None:
        self.running = (self.writes, done)
        self.unsynced = False

    def finish(self) -> None:
        assert self.running is not None, "no fsync is running"
        covered, done = self.running
        self.running = None
        self.durable = covered
        done()


class NoSnapshots:
    def due(self) -> bool:
        return False


def request(op: int, args: dict[str, Any]) -> tuple[int, bytes]:
    rid = next(_rids)
    return rid, wire.request_frame(rid, op, args)


def written(conn: Connection, since: int) -> list[list[Any]]:
    """The messages of each write to ``conn`` after its first ``since`` writes."""
    return [wire.Decoder(wire.MAX_FRAME_BYTES).feed(data)
            for data in transport(conn).writes[since:]]


async def test_a_pings_answer_leaves_ahead_of_its_connections_held_replies() -> None:
    shell = Shell()
    conn = shell.connect("client")
    await turn()
    for op, args in ((Op.MAILBOX_ENSURE, {"name": "jobs"}), (Op.SCOPE_CREATE, {"scope": "s"})):
        conn.data_received(request(op, args)[1])
        await turn()
    journal = FsyncOnCue()
    shell.commit = GroupCommit(
        journal, NoSnapshots(), asyncio.get_running_loop(),  # type: ignore[arg-type]
        shell.output.send_held)
    submit = {"scope": "s", "mailbox": "jobs", "data": None}
    before = len(transport(conn).writes)

    # One read: two submits (held for the fsync of their records), two PINGs between.
    (first, a), (ping_a, b), (second, c), (ping_b, d) = (
        request(Op.TASK_SUBMIT, submit), request(Op.PING, {}),
        request(Op.TASK_SUBMIT, submit), request(Op.PING, {}))
    conn.data_received(a + b + c + d)
    await turn()
    assert journal.running is not None and journal.durable == 0
    answers = written(conn, before)
    assert [[msg[:2] for msg in write] for write in answers] == [
        [[Kind.REPLY, ping_a], [Kind.REPLY, ping_b]]], "not the PINGs alone, in one write"

    # A later turn's PING: answered at once, behind nothing.
    ping_c, e = request(Op.PING, {})
    conn.data_received(e)
    await turn()
    assert [msg[:2] for msg in written(conn, before + 1)[0]] == [[Kind.REPLY, ping_c]]
    assert len(transport(conn).writes) == before + 2 and conn.held_bytes > 0

    journal.finish()  # the fsync covers both submits: their replies, in order, at once
    await turn()
    released = written(conn, before + 2)
    assert [[msg[:2] for msg in write] for write in released] == [
        [[Kind.REPLY, first], [Kind.REPLY, second]]]
    assert journal.durable == journal.writes and conn.held_bytes == 0

    # Nothing held: a PING's answer keeps its place in its turn's one write.
    (status, f), (ping_d, g), (again, h) = (
        request(Op.SCOPE_STATUS, {"scope": "s"}), request(Op.PING, {}),
        request(Op.SCOPE_STATUS, {"scope": "s"}))
    conn.data_received(f + g + h)
    await turn()
    assert [[msg[:2] for msg in write] for write in written(conn, before + 3)] == [
        [[Kind.REPLY, status], [Kind.REPLY, ping_d], [Kind.REPLY, again]]]
