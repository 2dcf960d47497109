"""Tickets: handles on shared tasks. A ticket is just a task id inside a run.

``rs.scope(run_id).task(task_id)`` re-attaches from any process; nothing is re-run.
``result()`` parks on the server and the result is pushed the moment the task ends:
it does not poll; ``events()`` follows its progress the same way (progress.py). A
timeout raises WaitTimeoutError here only; the task keeps going.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final, Literal, cast, overload

from .errors import UnavailableError, WaitTimeoutError
from .progress import TaskEvent, follow
from .retry import FirstWait, wait_across_reconnects
from .views import ChildView, TaskOutcome, TaskView
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Ticket"]

# Read as module constants, not as class attributes (``Op.TASK_RESULT``): Python 3.11
# specializes no attribute lookup on a class, so each of those is a full lookup per wait.
_TASK_RESULT: Final = Op.TASK_RESULT
_MAX_WAIT_MS: Final = Limits.MAX_WAIT_TIMEOUT_MS


class Ticket:
    """A task by id in its run: status, result (pushed when recorded), join, signal,
    cancel."""
    def __init__(
        self, session: Session, scope: str, task_id: str, view: dict[str, Any] | None = None
    ) -> None:
        self._session = session
        self.scope_id = scope
        self.id = task_id
        self.view = view or {}  # the task as last seen (submit's reply)

    def __repr__(self) -> str:
        return f"<Ticket {self.scope_id}/{self.id}>"

    @property
    def created(self) -> bool:
        """Whether the submit that made this ticket created the task (False: joined)."""
        return bool(self.view.get("created"))

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"scope": self.scope_id, "task": self.id, **extra}

    async def status(self) -> TaskView:
        """state, attempt, outcome, reason, tombstoned, key, subscribers, timestamps."""
        return cast("TaskView", await self._session.call(Op.TASK_STATUS, self._args()))

    @overload
    async def result(
        self, timeout_ms: int | None = None, *, outcome_only: Literal[False] = False
    ) -> TaskView: ...
    @overload
    async def result(
        self, timeout_ms: int | None = None, *, outcome_only: Literal[True]
    ) -> TaskOutcome: ...
    @overload
    async def result(
        self, timeout_ms: int | None = None, *, outcome_only: bool = False
    ) -> TaskView | TaskOutcome: ...
    async def result(
        self, timeout_ms: int | None = None, *, outcome_only: bool = False
    ) -> TaskView | TaskOutcome:
        """Wait for the task to end; returns its view ({"state", "outcome", "reason", ...}),
        or with ``outcome_only`` just its id, state, outcome and reason (``TaskOutcome``:
        a smaller reply, for a caller that needs no more).

        ``timeout_ms=None`` waits as long as it takes.
        """
        # The first wait is sent from here, and on a ready connection awaited here too
        # (``send_wait``: no coroutine between this one and its future); any failure
        # goes on in ``wait_across_reconnects``, as if it had sent it.
        if timeout_ms is None:
            limit, wait_ms = None, _MAX_WAIT_MS
        elif type(timeout_ms) is int and timeout_ms >= 0:  # (the common case: no call)
            limit = wait_ms = timeout_ms
        else:
            limit = wait_ms = max(0, int(timeout_ms))
        session = self._session
        args = {"scope": self.scope_id, "task": self.id, "timeout_ms": wait_ms}
        if outcome_only:
            args["outcome_only"] = True
        timeout = wait_ms / 1000.0
        # The first wait's send time, for the deadline of those made after a failure: the
        # clock read only then (its give-up line holds it) or before a wait not sent at once.
        sent_at: float | None = None
        # (a slot read, called: ``session.send_wait(...)`` is a method lookup that CPython
        # 3.11 does not specialize on a slot, made in full at every call)
        send_wait = session.send_wait
        try:
            sent = send_wait(_TASK_RESULT, args, timeout)
            if sent is None:  # not sent at once (connecting, or the socket's buffer full)
                sent_at = asyncio.get_running_loop().time()
                reply: TaskView | TaskOutcome = await session.request_cancellable(
                    _TASK_RESULT, args, withdraw=True, timeout=timeout
                )
                return reply  # (annotated, not cast: no call per result)
            rid, fut, line = sent
            try:
                reply = await fut
            except asyncio.CancelledError:
                session.stop_waiting(rid, fut, timeout)  # WaitTimeoutError if given up
                raise
            except UnavailableError:
                sent_at = line.sent_at(fut)
                raise
            finally:
                line.unwatch(fut)
            return reply
        except WaitTimeoutError:
            if limit is not None:
                raise
            first = FirstWait(0.0, None)  # (no limit: no deadline, the time unused)
        except UnavailableError as exc:  # (None: send_wait itself refused, nothing sent)
            first = FirstWait(_now() if sent_at is None else sent_at, exc)
        reply, _ = await wait_across_reconnects(
            session, _TASK_RESULT, args, limit,
            time_up=functools.partial(_not_finished, self.id, timeout_ms), first=first,
        )
        return reply

    def events(self, after: int = 0) -> AsyncIterator[TaskEvent]:
        """The task's events past seq ``after`` (0: all it still keeps): the retained
        ones first, then each as it happens, the outcome last (then the iteration ends).
        ``async for event in ticket.events():``; each ``TaskEvent`` has ``kind``
        ("progress", "state", "outcome"), ``seq``, its fields, and ``missed``: events
        before it this iteration will never see. Survives a lost connection (it
        subscribes again after the last seq it gave); see rsclient/progress.py."""
        session = self._session.for_run(self.scope_id)
        return follow(session, session.task_events(), self.scope_id, self.id, after)

    async def join(self, subscriber_id: str, scope_id: str | None = None) -> TaskView:
        """Record ``subscriber_id`` (of run ``scope_id``) as interested in this task."""
        return cast("TaskView", await self._session.call(
            Op.TASK_JOIN, self._args(subscriber_id=subscriber_id, subscriber_scope=scope_id)
        ))

    async def detach(self, subscriber_id: str) -> TaskView:
        """Unsubscribe. A task with no subscribers is not cancelled."""
        return cast("TaskView", await self._session.call(
            Op.TASK_DETACH, self._args(subscriber_id=subscriber_id)
        ))

    async def signal(self, name: str, data: Any = None) -> dict[str, Any]:
        """Signal the task: if it waits for ``name`` (``delivery.suspend(name)``) it is
        ready again and its next delivery carries ``{"name", "data"}`` as its
        ``signal``; if it has not suspended yet, the signal is kept and its suspend on
        ``name`` is woken at once. Returns ``{"id", "state", "woken"}``. Refused:
        InvalidArgumentError for a task that has ended or waits for another name, or
        data over 64 KiB; RunstateError (RESOURCE_EXHAUSTED) past 16 kept signals.
        Not sent again after a lost connection (UnavailableError: it may or may not
        have arrived; a second one would be kept for a later wait)."""
        reply = await self._session.call(
            Op.TASK_SIGNAL, self._args(name=name, data=data)
        )
        return cast("dict[str, Any]", reply)

    async def children(self) -> list[ChildView]:
        """The tasks submitted with this one as ``parent`` (``delivery.submit_child``),
        in submit order: ``{"id", "key", "state"}`` each (those forgotten left out)."""
        reply = await self._session.call(Op.TASK_CHILDREN, self._args())
        return cast("list[ChildView]", reply["children"])

    async def cancel(self, reason: str | None = None) -> TaskView:
        """End the task CANCELLED (no-op if it already ended); returns its view."""
        reply = await self._session.call(
            Op.TASK_CANCEL, self._args(reason=reason)
        )
        return cast("TaskView", reply)


def _now() -> float:
    """The running loop's time."""
    return asyncio.get_running_loop().time()


def _not_finished(task_id: str, timeout_ms: int | None) -> WaitTimeoutError:
    """The error of a ``result()`` whose limit ran out (a function, not a closure made
    in ``result``: the names it reads would be cells made at every call)."""
    return WaitTimeoutError(f"task {task_id} had not finished within {timeout_ms} ms")

