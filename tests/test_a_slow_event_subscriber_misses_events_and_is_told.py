"""A subscriber of a task's events that does not read never grows rsd: while its
connection's output is at the high-water mark, each TASK_EVENTS push for it is dropped
(not owed) and counted, and the next push of that task it gets says how many it
missed; the last push, the outcome, is owed, never dropped. A push shared by several
subscribers is the same bytes for each. In-process, on recording transports.
"""

from __future__ import annotations

import itertools
from typing import Any

from support.shell import Shell, transport, turn

import rsproto as wire
from rsd.policy import Policy
from rsd.wire.connection import Connection
from rsproto import Kind, Op, Push

_rids = itertools.count(100)


async def call(conn: Connection, op: int, args: dict[str, Any]) -> Any:
    rid = next(_rids)
    conn.data_received(wire.request_frame(rid, op, args))
    await turn(2)
    for msg in transport(conn).messages():
        if msg[0] == Kind.REPLY and msg[1] == rid:
            return msg[2]
        if msg[0] == Kind.ERROR and msg[1] == rid:
            raise AssertionError(f"refused: {msg}")
    raise AssertionError(f"no answer to {op}")


def pushes(conn: Connection) -> list[dict[str, Any]]:
    return [
        msg[2] for msg in transport(conn).messages()
        if msg[0] == Kind.PUSH and msg[1] == Push.TASK_EVENTS
    ]


async def test_a_slow_subscriber_is_dropped_events_and_told_how_many() -> None:
    shell = Shell()
    worker, slow, fast = shell.connect("worker"), shell.connect("slow"), shell.connect("fast")
    await turn()
    await call(worker, Op.MAILBOX_ENSURE, {"name": "jobs"})
    await call(worker, Op.SCOPE_CREATE, {"scope": "s"})
    submit = {"scope": "s", "mailbox": "jobs", "data": None}
    task = (await call(worker, Op.TASK_SUBMIT, submit))["id"]
    lease = (await call(worker, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}))["delivery"]["lease"]
    for follower in (slow, fast):
        reply = await call(follower, Op.TASK_EVENTS, {"scope": "s", "task": task})
        assert [event["seq"] for event in reply["events"]] == [1]  # where the task is
    transport(slow).buffered = Policy.OUTPUT_HIGH_WATER_BYTES  # it stopped reading
    writes = len(transport(slow).writes)
    for n in range(50):
        await call(worker, Op.DELIVERY_PROGRESS, {"lease": lease, "data": "x" * 1000 + str(n)})
    assert len(transport(slow).writes) == writes, "a push went to a reader at its mark"
    assert slow.owed is None or not slow.owed, "a push was kept for it"
    assert slow.missed_events == {task: 50}  # 50 progress
    got = pushes(fast)
    assert [body["events"][0]["seq"] for body in got] == list(range(2, 52))
    # Every subscriber of a push gets the same frame, encoded once.
    fast_frames = set(transport(fast).writes)
    # It reads again: the next push says what it missed.
    transport(slow).buffered = 0
    await call(worker, Op.DELIVERY_PROGRESS, {"lease": lease, "data": "after"})
    (body,) = pushes(slow)
    assert (body["events"][0]["seq"], body["missed"]) == (52, 50)
    assert pushes(fast)[-1]["missed"] == 0 and transport(fast).writes[-1] not in fast_frames
    # At the mark again, the outcome (the last push) is owed, not dropped.
    transport(slow).buffered = Policy.OUTPUT_HIGH_WATER_BYTES
    await call(worker, Op.DELIVERY_PROGRESS, {"lease": lease, "data": "lost"})
    await call(worker, Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": "done"})
    assert slow.owed is not None and len(slow.owed) == 1
    transport(slow).buffered = 0
    slow.resume_writing()
    await turn(3)
    last = pushes(slow)[-1]
    assert last["done"] is True and last["missed"] == 1
    assert last["events"][0]["outcome"] == "done"
    assert shell.core.progress.watching == {}


async def test_one_push_is_encoded_once_for_all_its_subscribers() -> None:
    shell = Shell()
    worker = shell.connect("worker")
    followers = [shell.connect(f"f{n}") for n in range(3)]
    await turn()
    await call(worker, Op.MAILBOX_ENSURE, {"name": "jobs"})
    await call(worker, Op.SCOPE_CREATE, {"scope": "s"})
    submit = {"scope": "s", "mailbox": "jobs", "data": None}
    task = (await call(worker, Op.TASK_SUBMIT, submit))["id"]
    lease = (await call(worker, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}))["delivery"]["lease"]
    for follower in followers:
        await call(follower, Op.TASK_EVENTS, {"scope": "s", "task": task})
    await call(worker, Op.DELIVERY_PROGRESS, {"lease": lease, "data": {"step": 1}})
    frames = [transport(follower).writes[-1] for follower in followers]
    assert frames[0] == frames[1] == frames[2]
    assert all(f is frames[0] for f in frames[1:]) or len(set(frames)) == 1
