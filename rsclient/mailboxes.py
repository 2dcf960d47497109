"""Mailboxes (work queues): ``rs.mailboxes`` defines them, ``run.mailbox(name)`` uses one.

``rs.mailboxes.ensure(name, ...)`` defines a queue once for every run;
``run.mailbox(name)`` addresses it inside one run: ``submit`` shared tasks (or
``submit_many`` in one request), ``send`` plain messages, ``receive`` one delivery (or
``receive_many``), or ``consume`` with a handler (the worker loop, in ``worker.py``).
A mailbox handle is just a name inside a run: making one does no I/O.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, cast, overload

from . import wire
from .deliveries import IDLE_WAIT_MS, Delivery, delay_ms_of, receive_many
from .errors import (
    InvalidArgumentError,
    RunstateError,
    UnavailableError,
    WaitTimeoutError,
    checked_bool,
    error_for,
)
from .tasks import Ticket
from .views import DeadLetter, Needs, QueueCounts, SentMessage, TaskOutcome, TaskView
from .wire import Limits, Op
from .worker import Worker

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Mailbox", "Mailboxes"]

_ITEM_FIELDS = frozenset({
    "data", "key", "subscriber_id", "deadline", "needs", "group", "delay_seconds", "not_before",
    "priority", "fairness_key", "after", "on_parent_failure", "parent",
    "concurrency_key", "concurrency_limit", "rate_key", "rate_limit", "rate_period_seconds",
})
Instant = str | dt.datetime | float


class Mailboxes:
    """``rs.mailboxes``: defining work queues (``ensure``)."""
    def __init__(self, session: Session) -> None:
        self._session = session

    async def ensure(
        self,
        name: str,
        mode: str = "WORK",
        *,
        max_attempts: int = Limits.DEFAULT_MAX_ATTEMPTS,
        retry_backoff_ms: int = Limits.DEFAULT_RETRY_BACKOFF_MS,
    ) -> dict[str, Any]:
        """Create the mailbox, or bring its settings to these values. Idempotent."""
        return cast("dict[str, Any]", await self._session.call(
            Op.MAILBOX_ENSURE,
            {
                "name": name,
                "mode": mode,
                "max_attempts": max_attempts,
                "retry_backoff_ms": retry_backoff_ms,
            },
        ))

    async def pause(self, name: str) -> dict[str, Any]:
        """Pause the mailbox in every run of this tenant: it takes submits and sends but
        delivers nothing until ``resume``; running deliveries finish. Durable;
        idempotent; NotFoundError for a mailbox never ensured. Its settings, ``paused``
        among them."""
        return await self._pause(name, True)

    async def resume(self, name: str) -> dict[str, Any]:
        """Deliver again from the mailbox in every run (parked receives are served at
        once); a pause in one run (``run.mailbox(name).pause()``) still holds that one."""
        return await self._pause(name, False)

    async def _pause(self, name: str, paused: bool) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._session.call(
            Op.MAILBOX_PAUSE, {"name": name, "paused": paused}
        ))


def _deadline(value: Instant | None, name: str = "deadline") -> float | None:
    """ISO 8601 text, a datetime or epoch seconds -> epoch seconds. Naive means UTC."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise InvalidArgumentError(
                f"{name} must be an ISO 8601 timestamp, got {value!r}"
            ) from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    raise InvalidArgumentError(f"{name} must be an ISO 8601 timestamp, got {value!r}")


def _order(
    args: dict[str, Any], delay_seconds: float | None, not_before: Instant | None,
    priority: int | None, fairness_key: str | None,
) -> dict[str, Any]:
    """``args`` with the item's delay and place (only the fields given); the server
    checks priority and fairness_key (INVALID_ARGUMENT naming the field)."""
    if delay_seconds is not None and not_before is not None:
        raise InvalidArgumentError("give delay_seconds or not_before, not both")
    if delay_seconds is not None:
        args["delay_ms"] = delay_ms_of(delay_seconds)
    if not_before is not None:
        args["not_before"] = _deadline(not_before, "not_before")
    if priority is not None:
        args["priority"] = priority
    if fairness_key is not None:
        args["fairness_key"] = fairness_key
    return args


def _submit_args(
    scope: str, mailbox: str, data: Any, key: str | None, subscriber_id: str | None,
    deadline: str | dt.datetime | float | None, needs: Needs | None, group: str | None,
    slim: bool, delay_seconds: float | None = None, not_before: Instant | None = None,
    priority: int | None = None, fairness_key: str | None = None,
) -> dict[str, Any]:
    """TASK_SUBMIT's args: only the fields given (an absent optional field means the same
    as nil to the server, and the frame, and its decoding there, is smaller)."""
    args: dict[str, Any] = {"scope": scope, "mailbox": mailbox, "data": data}
    if key is not None:
        args["key"] = key
    if subscriber_id is not None:
        args["subscriber_id"] = subscriber_id
    if deadline is not None:
        args["deadline"] = _deadline(deadline)
    if needs is not None:
        args["needs"] = needs
    if group is not None:
        args["group"] = group
    if slim:
        args["slim"] = True
    if delay_seconds is None and not_before is None and priority is None and fairness_key is None:
        return args  # (no order given, the common case: no call more)
    return _order(args, delay_seconds, not_before, priority, fairness_key)


def _every_submit_arg(
    scope: str, mailbox: str, data: Any, key: str | None, subscriber_id: str | None,
    deadline: Instant | None, needs: Needs | None, group: str | None, slim: bool,
    delay_seconds: float | None, not_before: Instant | None, priority: int | None,
    fairness_key: str | None, after: Iterable[Ticket | str] | None,
    on_parent_failure: str | None, parent: Ticket | str | None,
    concurrency_key: str | None, concurrency_limit: int | None, rate_key: str | None,
    rate_limit: int | None, rate_period_seconds: float | None,
) -> dict[str, Any]:
    """TASK_SUBMIT's args of a ``submit`` given more than data, key and slim: every
    field given, each checked (``_submit_args``, ``_links``, ``_key_limits``). Those of
    data, key and slim alone (the common case) ``submit`` builds itself, with no call."""
    args = _submit_args(scope, mailbox, data, key, subscriber_id, deadline, needs, group, slim,
                        delay_seconds, not_before, priority, fairness_key)
    if after is not None or on_parent_failure is not None or parent is not None:
        _links(args, after, on_parent_failure, parent)
    if (concurrency_key, concurrency_limit, rate_key, rate_limit,
            rate_period_seconds) != _NO_KEY_LIMITS:  # (no call when absent)
        _key_limits(args, concurrency_key, concurrency_limit, rate_key, rate_limit,
                    rate_period_seconds)
    return args


def _links(
    args: dict[str, Any], after: Iterable[Ticket | str] | None, on_parent_failure: str | None,
    parent: Ticket | str | None,
) -> dict[str, Any]:
    """TASK_SUBMIT's ``after``, ``on_parent_failure`` and ``parent`` (tickets as their
    ids), set in ``args`` only when given."""
    if after is not None:
        if type(after) is not list and (isinstance(after, str) or hasattr(after, "id")):
            raise InvalidArgumentError("after must be a list of tickets or task ids")
        # A copy (the caller's list stays theirs), each ticket as its id, in a plain loop:
        # a comprehension is a function called, once per submit.
        ids = list(after)
        for index, each in enumerate(ids):
            if type(each) is not str:
                ids[index] = _task_id(each)
        args["after"] = ids
    if on_parent_failure is not None:
        args["on_parent_failure"] = on_parent_failure
    if parent is not None:
        args["parent"] = parent if type(parent) is str else _task_id(parent)
    return args


def _task_id(task: Ticket | str) -> str:
    """A task id, or the id of a ticket (async or sync: anything with ``id``)."""
    return task if isinstance(task, str) else task.id


def _left(limit: int | None, loop: asyncio.AbstractEventLoop, started: float) -> int | None:
    """Milliseconds left of ``limit`` (None: no limit) since ``started`` (loop time). A
    function, not a closure in ``submit_and_wait``: its names would be cells made at
    every call."""
    return None if limit is None else max(0, limit - int((loop.time() - started) * 1000))


_NO_KEY_LIMITS = (None, None, None, None, None)  # a submit's limits by key, none given
# Read as a module's constant, not as the class attribute ``Op.TASK_SUBMIT``: Python
# 3.11 specializes no attribute lookup on a class, so that one is a full lookup per submit.
_TASK_SUBMIT: Final = Op.TASK_SUBMIT


def _wait_by_key(
    scope: str, key: str, limit: int | None, outcome_only: bool,
) -> tuple[int, dict[str, Any]]:
    """TASK_RESULT's timeout and arguments for the wait that follows a keyed submit in
    its write: the task named by key; no limit waits as long as the server allows."""
    wait_ms = Limits.MAX_WAIT_TIMEOUT_MS if limit is None else limit
    wait_args: dict[str, Any] = {"scope": scope, "key": key, "timeout_ms": wait_ms}
    if outcome_only:
        wait_args["outcome_only"] = True
    return wait_ms, wait_args


def _key_limits(
    args: dict[str, Any], concurrency_key: str | None, concurrency_limit: int | None,
    rate_key: str | None, rate_limit: int | None, rate_period_seconds: float | None,
) -> dict[str, Any]:
    """``args`` with the task's limits by key (only the fields given); the server checks
    them (INVALID_ARGUMENT naming the field): protocol.md "Limits by key"."""
    for name, value in (
        ("concurrency_key", concurrency_key), ("concurrency_limit", concurrency_limit),
        ("rate_key", rate_key), ("rate_limit", rate_limit),
        ("rate_period_seconds", rate_period_seconds),
    ):
        if value is not None:
            args[name] = value
    return args


def _chunks(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``items`` cut into requests of at most MAX_SUBMIT_BATCH items and, unless one
    item alone is larger, at most half a frame of encoded items."""
    budget = wire.MAX_FRAME_BYTES // 2
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for item in items:
        try:
            n = len(wire.pack_body(item))
        except (TypeError, ValueError, OverflowError):
            n = 0  # the request refuses it, naming why
        if current and (len(current) >= Limits.MAX_SUBMIT_BATCH or size + n > budget):
            chunks.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        chunks.append(current)
    return chunks


class Mailbox:
    """One mailbox inside one run."""

    def __init__(self, session: Session, scope: str, name: str) -> None:
        self._session = session
        self.scope_id = scope
        self.name = name

    def __repr__(self) -> str:
        return f"<Mailbox {self.scope_id}/{self.name}>"

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"scope": self.scope_id, "mailbox": self.name, **extra}

    async def submit(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        slim: bool = False,
        delay_seconds: float | None = None,
        not_before: Instant | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        after: Iterable[Ticket | str] | None = None,
        on_parent_failure: str | None = None,
        parent: Ticket | str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_key: str | None = None,
        rate_limit: int | None = None,
        rate_period_seconds: float | None = None,
    ) -> Ticket:
        """Submit a shared task; the same key and input (data, needs and priority) joins the
        existing task. With ``needs`` (``{"pools": [...], "quotas": {name: amount}}``) it is
        delivered only when all that capacity is free, taken at once. ``group`` puts the new task
        in that task group of the run (``run.group()``). ``slim``: the server answers with the id,
        state and ``created`` only (a smaller reply), and ``ticket.view`` holds just those.
        ``delay_seconds`` or ``not_before`` (the forms of ``deadline``; not both): DELAYED, never
        delivered before then. ``priority``: 0 (default) to 9, higher first. ``fairness_key``:
        ready tasks of one priority are delivered round robin between keys (a customer id, say).
        ``after``: tasks of this run (tickets or ids, at most 64) it waits for, BLOCKED until each
        has ended: it then runs if they all SUCCEEDED, and ends CANCELLED naming the parent
        otherwise, unless ``on_parent_failure="run"``; its deliveries carry ``parents``.
        ``parent``: a task of this run it is a child of (cancelled with it; ``ticket.children()``).
        ``concurrency_key``/``concurrency_limit``, ``rate_key``/``rate_limit`` (per
        ``rate_period_seconds``, 1 s by default): protocol.md "Limits by key"."""
        if (subscriber_id is None and deadline is None and needs is None and group is None
                and delay_seconds is None and not_before is None and priority is None
                and fairness_key is None and after is None and on_parent_failure is None
                and parent is None and concurrency_key is None and concurrency_limit is None
                and rate_key is None and rate_limit is None and rate_period_seconds is None):
            args = {"scope": self.scope_id, "mailbox": self.name, "data": data}
            if key is not None:
                args["key"] = key
            if slim:
                args["slim"] = True
        else:  # (the fields above, with none given, are built here: no call)
            args = _every_submit_arg(
                self.scope_id, self.name, data, key, subscriber_id, deadline, needs, group, slim,
                delay_seconds, not_before, priority, fairness_key, after, on_parent_failure,
                parent, concurrency_key, concurrency_limit, rate_key, rate_limit,
                rate_period_seconds)
        if self._session.spans is not None:  # OpenTelemetry's submit span (tracing.py)
            return await self._submit_in_span(args)
        try:  # (``_submit`` inlined: a coroutine less per task)
            view = await self._session.request(_TASK_SUBMIT, args)
        except UnavailableError as exc:  # sent again if keyed, or not executed
            view = await self._session.again(exc, _TASK_SUBMIT, args)
        return Ticket(self._session, self.scope_id, view["id"], view)

    async def _submit_in_span(self, args: dict[str, Any]) -> Ticket:
        """TASK_SUBMIT with ``args`` in OpenTelemetry's submit span (tracing.py), sent
        again where that is safe."""
        session = self._session
        assert session.spans is not None
        view = await session.spans.submitted(
            self.scope_id, self.name, args,
            functools.partial(session.call, _TASK_SUBMIT, args))
        return Ticket(session, self.scope_id, view["id"], view)

    async def _submit(self, args: dict[str, Any]) -> Ticket:
        """TASK_SUBMIT with ``args`` (``_submit_args``), sent again where that is safe."""
        try:
            view = await self._session.request(Op.TASK_SUBMIT, args)
        except UnavailableError as exc:  # sent again if keyed, or not executed
            view = await self._session.again(exc, Op.TASK_SUBMIT, args)
        return Ticket(self._session, self.scope_id, view["id"], view)

    @overload
    async def submit_and_wait(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        timeout_ms: int | None = None,
        delay_seconds: float | None = None,
        not_before: Instant | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        after: Iterable[Ticket | str] | None = None,
        on_parent_failure: str | None = None,
        parent: Ticket | str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_key: str | None = None,
        rate_limit: int | None = None,
        rate_period_seconds: float | None = None,
        outcome_only: Literal[False] = False,
    ) -> TaskView: ...
    @overload
    async def submit_and_wait(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        timeout_ms: int | None = None,
        delay_seconds: float | None = None,
        not_before: Instant | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        after: Iterable[Ticket | str] | None = None,
        on_parent_failure: str | None = None,
        parent: Ticket | str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_key: str | None = None,
        rate_limit: int | None = None,
        rate_period_seconds: float | None = None,
        outcome_only: Literal[True],
    ) -> TaskOutcome: ...
    @overload
    async def submit_and_wait(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        timeout_ms: int | None = None,
        delay_seconds: float | None = None,
        not_before: Instant | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        after: Iterable[Ticket | str] | None = None,
        on_parent_failure: str | None = None,
        parent: Ticket | str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_key: str | None = None,
        rate_limit: int | None = None,
        rate_period_seconds: float | None = None,
        outcome_only: bool = False,
    ) -> TaskView | TaskOutcome: ...
    async def submit_and_wait(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        timeout_ms: int | None = None,
        delay_seconds: float | None = None,
        not_before: Instant | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        after: Iterable[Ticket | str] | None = None, on_parent_failure: str | None = None,
        parent: Ticket | str | None = None,
        concurrency_key: str | None = None, concurrency_limit: int | None = None,
        rate_key: str | None = None, rate_limit: int | None = None,
        rate_period_seconds: float | None = None,
        outcome_only: bool = False,
    ) -> TaskView | TaskOutcome:
        """``submit(...)`` then ``ticket.result(timeout_ms, outcome_only=outcome_only)``,
        for a caller that awaits the result right after submitting: with a ``key``, both
        requests go in one write (the wait names the task by key, protocol.md "Submit and
        wait in one write"), so it costs one round trip, not two. The task's final view
        (its ``id`` included), or with ``outcome_only`` just its id, state, outcome and
        reason (``TaskOutcome``, a smaller reply); a timeout raises WaitTimeoutError and
        the task keeps going, as ``result()``."""
        args = _key_limits(
            _submit_args(self.scope_id, self.name, data, key, subscriber_id, deadline, needs,
                         group, True, delay_seconds, not_before, priority, fairness_key),
            concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period_seconds)
        _links(args, after, on_parent_failure, parent)  # (only those given)
        if key is None:  # no key to name the task by before its id is known
            return await (await self._submit(args)).result(
                timeout_ms, outcome_only=outcome_only)
        limit = None if timeout_ms is None else max(0, int(timeout_ms))
        wait_ms, wait_args = _wait_by_key(self.scope_id, key, limit, outcome_only)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            view, outcome = await self._session.request_then_wait(
                Op.TASK_SUBMIT, args, Op.TASK_RESULT, wait_args, timeout=wait_ms / 1000.0
            )
        except (UnavailableError, WaitTimeoutError) as exc:
            if isinstance(exc, WaitTimeoutError) and limit is not None:
                raise
            # Lost on the way (a keyed submit is sent again safely, with the very same
            # input, so it joins its task), or an endless wait's first link ended: one
            # request at a time from here.
            return await (await self._submit(args)).result(
                _left(limit, loop, started), outcome_only=outcome_only)
        if outcome.get("id") != view["id"]:  # the key named another task by then
            return await Ticket(self._session, self.scope_id, view["id"], view).result(
                _left(limit, loop, started), outcome_only=outcome_only)
        return cast("TaskView | TaskOutcome", outcome)

    async def submit_many(self, items: Iterable[dict[str, Any]]) -> list[Ticket | RunstateError]:
        """Submit many tasks, each a dict of ``submit``'s arguments (``data`` required; ``key``,
        ``subscriber_id``, ``deadline``, ``needs``, ``group``, the order and the limits by
        key), in as few requests as the
        server's ``max_submit_batch`` (256 items) and the frame limit allow (a request holds
        at most half a frame of items). One answer per item, in order: a Ticket (its
        ``view`` holds id, state and ``created``), or the error that item alone was refused
        with (ConflictError, InvalidArgumentError, ...): a refused item changes nothing and
        does not stop the others. An item too large for a frame of its own is answered with
        InvalidArgumentError and never sent."""
        wire_items: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            if not isinstance(item, dict) or "data" not in item:
                raise InvalidArgumentError(f"items[{index}] must be a dict with 'data'")
            unknown = set(item) - _ITEM_FIELDS
            if unknown:
                raise InvalidArgumentError(
                    f"items[{index}] has unknown fields {sorted(unknown)}; "
                    f"allowed: {sorted(_ITEM_FIELDS)}"
                )
            entry = dict(item)
            if entry.get("deadline") is not None:
                entry["deadline"] = _deadline(entry["deadline"])
            _order(entry, entry.pop("delay_seconds", None), entry.pop("not_before", None),
                   entry.pop("priority", None), entry.pop("fairness_key", None))
            _links(entry, entry.pop("after", None), entry.pop("on_parent_failure", None),
                   entry.pop("parent", None))
            wire_items.append(entry)
        spans = self._session.spans
        if spans is not None:  # one submit span, its context in every item (tracing.py)
            with spans.submit(self.scope_id, self.name, {"items": wire_items}):
                return await self._submit_many(wire_items)
        return await self._submit_many(wire_items)

    async def _submit_many(
        self, wire_items: list[dict[str, Any]]
    ) -> list[Ticket | RunstateError]:
        """``submit_many`` of ``wire_items`` (checked, in the wire's form)."""
        answers: list[Ticket | RunstateError] = []
        for chunk in _chunks(wire_items):
            args = self._args(items=chunk)
            try:
                reply = await self._session.request(Op.TASK_SUBMIT_MANY, args)
            except UnavailableError as exc:  # sent again if all keyed, or not executed
                reply = await self._session.again(exc, Op.TASK_SUBMIT_MANY, args)
            except InvalidArgumentError as exc:
                if len(chunk) > 1:
                    raise
                answers.append(exc)  # one item over the frame limit: never sent
                continue
            for result in reply["results"]:
                error = result.get("error")
                if error is not None:
                    answers.append(error_for(error["code"], error["message"], error["details"]))
                else:
                    answers.append(Ticket(self._session, self.scope_id, result["id"], result))
        return answers

    async def send(
        self, data: Any, *, work_key: str | None = None, needs: Needs | None = None,
        delay_seconds: float | None = None, not_before: Instant | None = None,
        priority: int | None = None, fairness_key: str | None = None,
        debounce_key: str | None = None, debounce_seconds: float | None = None,
    ) -> SentMessage:
        """Put a plain message on the queue; ``{"id", "replay"}``. ``needs``,
        ``delay_seconds``, ``not_before``, ``priority`` and ``fairness_key`` as for
        ``submit`` (priority is part of a work_key's input too).

        ``debounce_key`` with ``debounce_seconds`` (the window, more than 0): while a
        message sent with that key waits undelivered in this queue, this send replaces
        its data and moves its due time to now + the window, answered with its id and
        ``replaced`` True; otherwise a new message is made, due at now + the window
        (``replaced`` False). Once it is delivered, the next send starts a new one. Not
        with ``work_key``, ``needs`` or a delay (protocol.md, "Debounced sends")."""
        args = _order(self._args(data=data, work_key=work_key, needs=needs), delay_seconds,
                      not_before, priority, fairness_key)
        if debounce_key is not None or debounce_seconds is not None:
            args["debounce_key"] = debounce_key
            args["debounce_seconds"] = debounce_seconds
        session = self._session
        if session.spans is not None:  # OpenTelemetry's submit span (tracing.py)
            return cast("SentMessage", await session.spans.submitted(
                self.scope_id, self.name, args,
                functools.partial(session.call, Op.MESSAGE_SEND, args)))
        try:
            reply = await self._session.request(Op.MESSAGE_SEND, args)
        except UnavailableError as exc:  # sent again if it has a work key, or not executed
            reply = await self._session.again(exc, Op.MESSAGE_SEND, args)
        return cast("SentMessage", reply)

    async def receive(
        self, *, lease_seconds: float = 30, wait: bool = False, timeout_ms: int = IDLE_WAIT_MS,
        release_on_disconnect: bool = False,
    ) -> Delivery | None:
        """One delivery, or None if the queue is empty. Not renewed for you.
        ``release_on_disconnect``: its lease ends the moment this client's connection
        closes (the task goes back to the queue at once), and is lost here then."""
        got = await receive_many(  # (``receive``'s body: a coroutine less per delivery)
            self._session, self.scope_id, self.name, lease_seconds, wait, timeout_ms, None,
            auto_renew=False, release_on_disconnect=release_on_disconnect,
        )
        return got[0] if got else None

    async def receive_many(
        self, max: int, *, lease_seconds: float = 30, wait: bool = False,
        timeout_ms: int = IDLE_WAIT_MS, release_on_disconnect: bool = False,
    ) -> list[Delivery]:
        """Up to ``max`` deliveries (1 to the server's ``max_receive_batch``, 256) in one
        request, in queue order; empty if none is ready (``wait``: parks until one is).
        Each has its own lease, not renewed for you (``release_on_disconnect`` as for
        ``receive``)."""
        if type(max) is not int or not 1 <= max <= Limits.MAX_RECEIVE_BATCH:
            raise InvalidArgumentError(
                f"max must be an integer from 1 to {Limits.MAX_RECEIVE_BATCH}, got {max!r}"
            )
        return await receive_many(
            self._session, self.scope_id, self.name, lease_seconds, wait, timeout_ms, max,
            auto_renew=False, release_on_disconnect=release_on_disconnect,
        )

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters: {id, kind, key, data, attempt, reason, at}."""
        reply = await self._session.call(Op.DEAD_LETTERS, self._args(limit=limit))
        return cast("list[DeadLetter]", reply["items"])

    async def inspect(self) -> QueueCounts:
        """Counts as the server sees them: ready, running, consumers, dead_letters, and
        whether it is paused."""
        return cast("QueueCounts", await self._session.call(Op.QUEUE_INSPECT, self._args()))

    async def pause(self) -> QueueCounts:
        """Pause this mailbox in this run alone: it takes submits and sends but delivers
        nothing until ``resume``; running deliveries finish. Durable; idempotent."""
        return await self._pause(True)

    async def resume(self) -> QueueCounts:
        """Deliver again in this run (parked receives are served at once), unless the
        mailbox is paused for every run (``rs.mailboxes.pause``)."""
        return await self._pause(False)

    async def _pause(self, paused: bool) -> QueueCounts:
        return cast("QueueCounts", await self._session.call(
            Op.QUEUE_PAUSE, self._args(paused=paused)
        ))

    async def consume(
        self,
        handler: Callable[[Any, Delivery], Any],
        *,
        concurrency: int = 1,
        lease_seconds: float = 60,
        stop_event: asyncio.Event | None = None,
        on_error: Callable[[BaseException, Delivery], Any] | None = None,
        shutdown_timeout: float = 30.0,
        release_on_disconnect: bool = False,
    ) -> None:
        """Run ``handler(data, delivery)`` on each delivery, ``concurrency`` at a time,
        until ``stop_event`` is set or the run is cancelled (see ``worker.py``).
        ``release_on_disconnect``: each delivery's lease ends the moment this client's
        connection closes (its task goes back to the queue at once: a killed worker's
        tasks are taken over in milliseconds), and its handler is cancelled here then,
        as for any lost lease."""
        checked_bool(release_on_disconnect)
        if not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgumentError("concurrency must be a positive integer")
        # The least lease is the server's (HELLO announces it; the protocol's 5 s unless a
        # test server lowered it): its first RECEIVE refuses a shorter one, which ends
        # consume() as an InvalidArgumentError, as receive() and acquire() leave it to it.
        if not 0 < lease_seconds <= Limits.MAX_LEASE_SECONDS:
            raise InvalidArgumentError(
                f"lease_seconds must be above 0 and at most {Limits.MAX_LEASE_SECONDS}"
            )
        worker = Worker(
            self._session, self, handler, concurrency, lease_seconds, on_error,
            release_on_disconnect,
        )
        await worker.run(stop_event or asyncio.Event(), shutdown_timeout)
