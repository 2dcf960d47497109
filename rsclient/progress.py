"""A task's events, followed: ``async for event in ticket.events():``.

The server keeps a task's last events (its progress, the state changes between, see
protocol.md "Task events") and pushes each new one to the connections that follow the
task (TASK_EVENTS); the outcome is the last event, then the iteration ends.

What always holds:
- one subscription per task and connection on the server, however many iterators of
  that task the client runs: each iterator gets every event once, in seq order (an
  event whose seq it has passed is skipped), the retained ones first;
- after a lost connection, every iterator not ended subscribes again on the next one
  with ``after`` the last seq it gave (``TASK_EVENTS`` is sent again like a read:
  sdkrules), so it gets what it missed that is still retained, and ``missed`` on the
  next event says how many it cannot have;
- an iterator's queue holds at most ``MAX_QUEUED`` events: a reader that falls further
  behind loses the oldest, counted in ``missed`` too; the client never grows for it;
- an iterator left (``break``, or garbage) ends its task's subscription when it was the
  last of that task (``stop``, sent without waiting for the answer).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import UnavailableError
from .retry import Backoff
from .wire import Op, Push

if TYPE_CHECKING:
    from .connection import Connection
    from .session import Session

__all__ = ["MAX_QUEUED", "TaskEvent", "TaskEventRouter", "follow"]

MAX_QUEUED = 1000  # events an iterator keeps for a reader that has not caught up


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event of a task: ``kind`` is "progress" (``data``, published at ``at``),
    "state" (``state``, ``attempt``) or "outcome" (``state``, ``outcome``, ``reason``:
    the last); ``seq`` numbers the task's events; ``missed``: how many events before
    this one this iterator will never see (dropped by the server's retention or for a
    slow reader)."""

    seq: int
    kind: str
    data: Any = None
    state: str | None = None
    attempt: int | None = None
    outcome: Any = None
    reason: str | None = None
    at: float | None = None
    tombstoned: bool = False
    missed: int = 0

    @classmethod
    def of(cls, event: dict[str, Any], missed: int) -> TaskEvent:
        return cls(
            event["seq"], event["kind"], event.get("data"), event.get("state"),
            event.get("attempt"), event.get("outcome"), event.get("reason"),
            event.get("at"), bool(event.get("tombstoned")), missed,
        )


class _Follower:
    """One iterator's queue, the last seq it took, and its wake-up."""

    __slots__ = (
        "done", "held", "last", "missed", "queue", "resubscribe", "scope", "subscribing",
        "task", "waker",
    )

    def __init__(self, scope: str, task: str, after: int) -> None:
        self.scope = scope
        self.task = task
        self.last = after  # the last seq queued
        self.queue: collections.deque[TaskEvent] = collections.deque()
        self.missed = 0  # missed before the next event queued
        self.done = False  # the outcome is queued
        self.resubscribe = True  # (re)subscribe before waiting
        # Its subscribe's answer is awaited: pushes are held meanwhile, and taken after
        # the answer (``caught_up``). A push the server sent after its answer can reach
        # the router before this iterator has resumed with the answer (both read in one
        # turn): passed over, its events were lost (an agent's first progress event,
        # missing from a follower's stream under load).
        self.subscribing = False
        self.held: list[tuple[list[dict[str, Any]], int, bool]] = []
        self.waker: asyncio.Future[None] | None = None

    def take(self, events: list[dict[str, Any]], missed: int, done: bool) -> None:
        self.missed += missed
        for event in events:
            if event["seq"] <= self.last and event["kind"] != "outcome":
                continue  # seen already (a subscription made again, a second iterator)
            self.last = event["seq"]
            if len(self.queue) >= MAX_QUEUED:
                dropped = self.queue.popleft()
                self.missed += dropped.missed + 1
            self.queue.append(TaskEvent.of(event, self.missed))
            self.missed = 0
            if event["kind"] == "outcome":
                self.done = True
        if done:
            self.done = True
        self.wake()

    def caught_up(self, reply: dict[str, Any]) -> None:
        """Take a subscribe's answer, then the pushes held while it was awaited (those
        it already holds are skipped by seq, their ``missed`` with them)."""
        self.take(reply["events"], reply["missed"], reply["done"])
        held, self.held = self.held, []
        for events, missed, done in held:
            new = any(event["seq"] > self.last or event["kind"] == "outcome"
                      for event in events)
            self.take(events, missed if new else 0, done)

    def wake(self) -> None:
        waker = self.waker
        if waker is not None and not waker.done():
            waker.set_result(None)


class TaskEventRouter:
    """The TASK_EVENTS pushes of one connection, to the iterators of each task."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.followers: dict[str, set[_Follower]] = {}
        conn.on_push(Push.TASK_EVENTS, self._pushed)
        conn.on_link_lost(self._lost)

    def _pushed(self, body: dict[str, Any]) -> None:
        followers = self.followers.get(body["task"])
        if not followers:
            return
        for follower in list(followers):
            if follower.subscribing:
                follower.held.append((body["events"], body["missed"], body["done"]))
            else:
                follower.take(body["events"], body["missed"], body["done"])
        if body["done"]:
            self.followers.pop(body["task"], None)  # the server ended the subscription

    def _lost(self) -> None:
        """The connection ended, and its subscriptions with it: each iterator not done
        subscribes again (``after`` its last seq) on the next one."""
        for followers in self.followers.values():
            for follower in followers:
                follower.resubscribe = True
                follower.wake()

    def add(self, follower: _Follower) -> None:
        """``follower`` hears its task's pushes from now on (beside any other of it)."""
        self.followers.setdefault(follower.task, set()).add(follower)

    def remove(self, follower: _Follower, session: Session) -> None:
        """``follower`` is left; the last of its task ends the subscription."""
        followers = self.followers.get(follower.task)
        if followers is None:
            return
        followers.discard(follower)
        if not followers:
            del self.followers[follower.task]
            if not follower.done and not session.closed:
                session.send_nowait(Op.TASK_EVENTS, {
                    "scope": follower.scope, "task": follower.task, "stop": True,
                })


async def follow(session: Session, router: TaskEventRouter, scope: str, task: str,
                 after: int = 0) -> AsyncIterator[TaskEvent]:
    """The events of ``task`` past seq ``after`` (see the module docstring)."""
    follower = _Follower(scope, task, after)
    router.add(follower)
    loop = asyncio.get_running_loop()
    try:
        while True:
            if follower.queue:
                event = follower.queue.popleft()
                yield event
                if event.kind == "outcome":
                    return
                continue
            if follower.done:
                return
            if follower.resubscribe:
                follower.resubscribe = False
                reply = await _subscribe(session, follower)
                router.add(follower)  # (the router may have dropped it: a done push)
                follower.caught_up(reply)
                continue
            follower.waker = loop.create_future()
            try:
                await follower.waker
            finally:
                follower.waker = None
    finally:
        router.remove(follower, session)


async def _subscribe(session: Session, follower: _Follower) -> dict[str, Any]:
    """TASK_EVENTS for ``follower`` (``after`` its last seq), sent again after a lost
    connection (with backoff) until answered or the client is closed; an error answer
    (NOT_FOUND, RESOURCE_EXHAUSTED) is raised."""
    args = {"scope": follower.scope, "task": follower.task, "after": follower.last}
    backoff = Backoff(0.05, 2.0)
    follower.subscribing = True
    try:
        while True:
            try:
                reply: dict[str, Any] = await session.call(Op.TASK_EVENTS, args)
                return reply
            except UnavailableError:
                if session.closed:
                    raise
                await backoff.sleep()
    finally:
        follower.subscribing = False
