"""A payload is accepted only if it can be carried all the way: sent, journalled,
delivered back and written to a snapshot.

msgpack decodes up to 1024 nested containers, so a request can carry ``data`` 1022
levels deep (the frame adds two: the request array and the args map). Whatever depth the
core accepts must survive everything downstream, which has less room: the canonical
digest of TASK_SUBMIT and keyed MESSAGE_SEND, a RECEIVE reply (three more containers), a
DEAD_LETTERS reply or a snapshot record (three or four). Refusing it at the boundary with
INVALID_ARGUMENT is a fine answer; an INTERNAL error, a lost record or an unwritable
snapshot is not. The SDK refuses locally what the wire cannot carry at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.core import CoreDriver, call
from support.process import Rsd
from support.raw import RawConn

from rsclient import AsyncRunstate, InvalidArgumentError, wire
from rsd.core import Core, CoreError, Rec
from rsd.disk.logfile import JOURNAL_MAGIC, encode_batch, new_salt, scan
from rsproto import ErrorCode, Kind, Op

MakeClient = Callable[..., AsyncRunstate]


def nested(depth: int) -> Any:
    """``depth`` arrays, one inside the other, around a nil: a small, valid payload."""
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


# ---- in the core ---------------------------------------------------------------------------


def outcome(core: Core, now: float, op: int, args: dict[str, Any]) -> tuple[str, Any]:
    """("ok", result) or ("refused", code); any other exception is a server bug (the
    server would answer INTERNAL and log a traceback), reported as an assertion."""
    try:
        return "ok", call(core, now, op, args)
    except CoreError as exc:
        return "refused", exc.code
    except Exception as exc:  # that is the finding: the server would answer INTERNAL
        raise AssertionError(
            f"op {op} raised {type(exc).__name__} inside the core: {exc}"
        ) from None


@pytest.mark.parametrize("op", [Op.TASK_SUBMIT, Op.MESSAGE_SEND], ids=["submit", "send"])
def test_deeply_nested_data_is_refused_cleanly_not_an_internal_error(op: int) -> None:
    core = CoreDriver(recovered=True)
    args: dict[str, Any] = {"scope": "s", "mailbox": "jobs", "data": nested(1000)}
    if op == Op.MESSAGE_SEND:
        args["work_key"] = "w"  # only a keyed send takes the digest
    else:
        args["key"] = "k"
    kind, result = outcome(core, 0.0, op, args)
    assert kind == "ok" or result == ErrorCode.INVALID_ARGUMENT


def test_an_accepted_payload_can_be_delivered_back_on_the_wire() -> None:
    core = CoreDriver(recovered=True)
    data = nested(1022)
    frame = wire.encode([Kind.REQUEST, 7, Op.MESSAGE_SEND,
                         {"scope": "s", "mailbox": "jobs", "data": data}])
    assert wire.Decoder().feed(frame), "the request itself is a valid frame"
    kind, _ = outcome(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs",
                                                    "data": data})
    if kind == "refused":
        return  # refusing it at the boundary is a fine answer
    delivery = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
    try:
        wire.reply_frame(8, delivery)
    except wire.FrameError as exc:
        raise AssertionError(f"accepted data cannot be delivered: {exc.message}") from None


def test_a_snapshot_can_always_be_written() -> None:
    core = CoreDriver(recovered=True)
    kind, _ = outcome(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs",
                                                    "data": nested(1022)})
    if kind == "refused":
        return
    delivery = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    call(core, 0.0, Op.DELIVERY_REJECT, {"lease": delivery["lease"]})
    core.drain()
    try:
        encode_batch(list(core.snapshot()), new_salt())
    except ValueError as exc:
        raise AssertionError(f"the snapshot cannot be encoded: {exc}") from None


# ---- through a real rsd ------------------------------------------------------------------


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
    message is in the journal."""
    server = Rsd(tmp_path)
    await server.start("--fsync", "always")
    try:
        consumer = await raw_connect(server.address)
        sender = await raw_connect(server.address)
        await consumer.hello("consumer")
        await sender.hello("sender")
        await consumer.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
        await consumer.ok(Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
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
        code = await server.stop()
    assert code == 0
    enqueued = [
        rec[1]
        for segment in server.segments()
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


async def test_payloads_the_wire_cannot_carry_are_refused_locally(clients: MakeClient) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    with pytest.raises(InvalidArgumentError) as refused:
        await box.submit({"ids": {1, 2}}, key="a-set")
    assert refused.value.code == "INVALID_ARGUMENT"
    with pytest.raises(InvalidArgumentError) as refused:
        await box.send(b"x" * (2 << 20))  # over the 1 MiB frame limit: never sent
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "1048576" in refused.value.message
    assert "time" in await rs.ping()  # the connection is untouched
    assert (await box.submit({"ids": [1, 2]}, key="a-set")).created
