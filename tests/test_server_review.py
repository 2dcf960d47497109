"""Review findings that need a real rsd: the server's output path.

A test marked ``xfail(strict=True)`` documents a bug that is still there; it asserts the
behaviour protocol.md promises and must lose its marker once the bug is fixed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conftest import RawConn, spawn_rsd, wait_ready

from rsd.core import Rec
from rsd.logfile import JOURNAL_MAGIC, scan
from rsproto import Kind, Op


def nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


async def answer(conn: RawConn, timeout: float) -> Any:
    """The next frame from rsd, or None if nothing came within ``timeout`` seconds."""
    try:
        return await conn.recv(timeout)
    except TimeoutError:
        return None


async def test_a_deferred_reply_that_cannot_be_encoded_loses_no_journal_records(
    tmp_path: Path, raw_connect: Callable[[str], Awaitable[RawConn]]
) -> None:
    """Under --fsync always, a MESSAGE_SEND reply says the message is durable. Whatever
    happens to the delivery to the parked consumer (refused at the boundary, answered
    with an error, or delivered), every request gets one answer and the acknowledged
    message is in the journal. Suggested fix: in _flush, write the records first, then
    encode each message in a try (an unencodable deferred reply becomes an INTERNAL
    error frame for that request id); and bound payload depth at the boundary (see
    test_core_review.py)."""
    log_path = tmp_path / "rsd.log"
    server = wait_ready(spawn_rsd(tmp_path / "data", log_path, "--fsync", "always"), log_path)
    try:
        consumer = await raw_connect(server.address)
        sender = await raw_connect(server.address)
        await consumer.hello("consumer")
        await sender.hello("sender")
        await consumer.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
        parked = await consumer.request(
            Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True, "timeout_ms": 1000}
        )
        assert await answer(consumer, 0.3) is None, "the RECEIVE parks"
        sent = await sender.request(
            Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": nested(1022)}
        )
        reply = await answer(sender, 3.0)
        assert reply is not None and reply[1] == sent, "MESSAGE_SEND is answered"
        if reply[0] == Kind.ERROR:
            return  # refused at the boundary: nothing was promised
        message_id = reply[2]["id"]
        got = await answer(consumer, 2.0)
        answered = got is not None and got[1] == parked
    finally:
        code = server.stop()
    assert code == 0
    enqueued = [
        rec[1]
        for segment in sorted((tmp_path / "data").glob("journal-*.log"))
        for rec in scan(segment, JOURNAL_MAGIC).records
        if rec[0] == Rec.ITEM_ENQUEUED
    ]
    assert {
        "the parked RECEIVE got its one answer": answered,
        "the acknowledged message is in the journal": message_id in enqueued,
    } == {
        "the parked RECEIVE got its one answer": True,
        "the acknowledged message is in the journal": True,
    }
