"""A follower's subscribe (TASK_EVENTS) is answered with the retained events, and the
server pushes each later one; the answer and the next push can be read in one turn of
the client's loop, so the push reaches the router before the iterator has resumed with
the answer. The push must not be passed over: it was, and the approval agent's first
progress event went missing from its planner's stream under load (tests/test_examples_
run.py: RUNNING, then the second step). The SDK's rule, on a stand-in connection that
delivers both in the same turn; the TypeScript twin has its own test
(sdk/typescript/test/progress_push_with_the_answer.test.ts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from rsclient.progress import TaskEvent, TaskEventRouter, follow
from rsclient.wire import Op, Push


class Conn:
    """The router's side of a connection: its push handlers."""

    def __init__(self) -> None:
        self.pushes: dict[int, Callable[[dict[str, Any]], None]] = {}

    def on_push(self, event: int, handler: Callable[[dict[str, Any]], None]) -> None:
        self.pushes[event] = handler

    def on_link_lost(self, handler: Callable[[], None]) -> None:
        pass


class Session:
    """Answers TASK_EVENTS with ``answer`` and, in the same turn, pushes ``pushed``."""

    closed = False

    def __init__(self, conn: Conn, answer: dict[str, Any], pushed: dict[str, Any]) -> None:
        self.conn, self.answer, self.pushed = conn, answer, pushed

    async def call(self, op: int, args: dict[str, Any]) -> dict[str, Any]:
        assert op == Op.TASK_EVENTS
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        reply.set_result(self.answer)  # the answer's frame, read first...
        self.conn.pushes[Push.TASK_EVENTS](self.pushed)  # ...then the push's, same turn
        return await reply

    def send_nowait(self, op: int, args: dict[str, Any]) -> None:
        pass


async def gathered(events: AsyncIterator[TaskEvent]) -> list[TaskEvent]:
    """Every event to the outcome (a lost one: the iterator waits on; fails in 10 s)."""
    async def each() -> list[TaskEvent]:
        return [e async for e in events]
    return await asyncio.wait_for(each(), 10)


def event(seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, **fields}


async def test_a_push_read_in_the_turn_of_the_answer_is_taken_after_it() -> None:
    conn = Conn()
    router = TaskEventRouter(conn)  # type: ignore[arg-type]
    answer = {"events": [event(1, "state", state="RUNNING", attempt=1)], "missed": 0,
              "done": False}
    pushed = {"task": "t", "events": [event(2, "progress", data={"step": "greeting"}),
                                      event(3, "outcome", state="SUCCEEDED")],
              "missed": 0, "done": True}
    session = Session(conn, answer, pushed)
    events = await gathered(follow(session, router, "s", "t"))  # type: ignore[arg-type]
    assert [(e.seq, e.kind, e.missed) for e in events] == [
        (1, "state", 0), (2, "progress", 0), (3, "outcome", 0)]


async def test_a_held_push_the_answer_already_holds_is_taken_once() -> None:
    conn = Conn()
    router = TaskEventRouter(conn)  # type: ignore[arg-type]
    both = [event(1, "state", state="RUNNING", attempt=1), event(2, "progress", data=1)]
    answer = {"events": both, "missed": 0, "done": False}
    pushed = {"task": "t", "events": [both[1], event(3, "outcome", state="FAILED")],
              "missed": 0, "done": True}
    session = Session(conn, answer, pushed)
    events = await gathered(follow(session, router, "s", "t"))  # type: ignore[arg-type]
    assert [(e.seq, e.kind) for e in events] == [(1, "state"), (2, "progress"), (3, "outcome")]
