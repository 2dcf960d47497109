"""Task tickets: reading a task, waiting for its result, subscribing, cancelling.

What always holds:
- a task's reads (status, result, join, detach, cancel) name it by scope and id, and a
  result wait may name it by scope and key instead (``by_key``: so a client can send
  it in the same write as the keyed submit, before it knows the id); another scope's
  task, and another tenant's, is NOT_FOUND with the message a task that does not exist
  gets;
- a ``result`` wait on a task not yet ended parks (a ``ResultWait``) and is answered
  by the ending (endings.py) with the task's view, at once: nothing polls; a wait with
  ``outcome_only`` is answered, at once or at the ending, with only what a waiter for the
  outcome reads (``Item.outcome_view``), one without with the whole view, as always;
- a task with no subscribers keeps going: only cancel (or its run's) stops it;
- a subscriber is stored on the task (SUBSCRIBED / DETACHED records) and charged to its
  tenant's stored bytes while it is there.
How a task ends, and its retention, tombstone and forgetting, are endings.py's.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ..ground.effects import DEFERRED
from ..ground.errors import CoreError
from ..ground.payloads import subscription_size
from ..ground.validate import invalid, opt_bool, opt_number, opt_text, req_text
from ..ground.waits import Wait, WaitLine
from ..records import Rec
from ..records.itemrecords import Detached, Subscribed
from ..run.items import Event, Item
from ..state.tables import Applier, Handler, Tables
from .endings import Endings
from .workbook import Work

__all__ = ["ResultWait", "Tasks"]

_MAX_SCOPE_ID_BYTES: Final = Limits.MAX_SCOPE_ID_BYTES
_MAX_KEY_BYTES: Final = Limits.MAX_KEY_BYTES
_DEFAULT_WAIT_TIMEOUT_MS: Final = Limits.DEFAULT_WAIT_TIMEOUT_MS


class Tasks:
    """The task ops (TASK_STATUS, TASK_RESULT, TASK_JOIN, TASK_DETACH, TASK_CANCEL) and
    the subscription records. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, endings: Endings) -> None:
        self.tables = tables
        self.work = work
        self.endings = endings
        self.ops: dict[int, Handler] = {
            Op.TASK_STATUS: self.status,
            Op.TASK_RESULT: self.result,
            Op.TASK_JOIN: self.join,
            Op.TASK_DETACH: self.detach,
            Op.TASK_CANCEL: self.cancel,
        }
        self.appliers: dict[int, Applier] = {
            Rec.SUBSCRIBED: self.apply_subscription,
            Rec.DETACHED: self.apply_subscription,
        }

    # ---- tickets ---------------------------------------------------------------------

    def task_of(self, conn: int, args: dict[str, Any], by_key: bool = False) -> Item:
        """The task ``args`` names by ``scope`` and ``task`` (its id) or, ``by_key``
        and without ``task``, by ``scope`` and ``key``."""
        scope_id = req_text(args, "scope", _MAX_SCOPE_ID_BYTES)
        if by_key and args.get("task") is None and args.get("key") is not None:
            key = req_text(args, "key", _MAX_KEY_BYTES)
            scope = self.tables.run(self.tables.tenant_of(conn), scope_id)
            keyed = scope.tasks.get(key)
            if keyed is None:
                raise CoreError(
                    ErrorCode.NOT_FOUND, f"no task with key {key!r} in scope {scope_id!r}"
                )
            return keyed
        task_id = req_text(args, "task", _MAX_KEY_BYTES)
        if by_key and args.get("key") is not None:
            raise invalid("name the task by task or by key, not both")
        self.tables.run(tenant := self.tables.tenant_of(conn), scope_id)
        item = self.work.items.get(task_id)
        if (
            item is None
            or item.is_message
            or item.scope != scope_id
            or item.tenant != tenant  # (``Tenants.owns``, with the tenant at hand)
        ):
            raise CoreError(ErrorCode.NOT_FOUND, f"no task {task_id!r} in scope {scope_id!r}")
        return item

    def status(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        return self.task_of(conn, args).view()

    def result(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        item = self.task_of(conn, args, by_key=True)
        timeout_ms = opt_number(
            args, "timeout_ms", _DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        outcome_only = opt_bool(args, "outcome_only", False)
        if item.terminal:
            return item.outcome_view() if outcome_only else item.view()
        if timeout_ms == 0:
            raise CoreError(ErrorCode.WAIT_TIMEOUT, f"task {item.id} has not finished")
        watcher = ResultWait(item, conn, rid, now + timeout_ms / 1000.0, now, outcome_only)
        watchers = item.watchers
        if type(watchers) is tuple:  # the commonest case: one watcher, kept without a line
            item.watchers = watcher
        elif type(watchers) is ResultWait:
            line = item.watchers = WaitLine()
            line.append(watchers)
            line.append(watcher)
        else:
            watchers.append(watcher)
        self.tables.waits.add(watcher)
        return DEFERRED

    def join(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        item = self.task_of(conn, args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        subscriber_scope = opt_text(args, "subscriber_scope", _MAX_SCOPE_ID_BYTES)
        if item.subscribers.get(subscriber, 0) != subscriber_scope:
            self.subscribe(now, item, subscriber, subscriber_scope)
        return item.view()

    def subscribe(self, now: float, item: Item, subscriber: str, scope: str | None) -> None:
        if subscriber not in item.subscribers and (
            len(item.subscribers) >= Limits.MAX_SUBSCRIBERS_PER_TASK
        ):
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"task {item.id} has {Limits.MAX_SUBSCRIBERS_PER_TASK} subscribers, the limit",
            )
        self.tables.tenants.room_for_bytes(item.tenant, _subscribing(item, subscriber, scope))
        self.tables.commit(Subscribed(Rec.SUBSCRIBED, item.id, subscriber, scope), now)

    def detach(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Unsubscribe. A task with no subscribers keeps going: only cancel stops it."""
        item = self.task_of(conn, args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        if subscriber in item.subscribers:
            self.tables.commit(Detached(Rec.DETACHED, item.id, subscriber), now)
        return item.view()

    def apply_subscription(self, rec: tuple[Any, ...], now: float) -> None:
        item = self.work.items.get(rec[1])
        if item is None:
            return
        if rec[0] == Rec.SUBSCRIBED:
            self.tables.tenants.charge(item.tenant, _subscribing(item, rec[2], rec[3]))
            if not item.subscribers:
                item.subscribers = {}
            item.subscribers[rec[2]] = rec[3]  # type: ignore[index]
        elif rec[2] in item.subscribers:
            scope = item.subscribers.pop(rec[2])  # type: ignore[attr-defined]
            self.tables.tenants.charge(item.tenant, -subscription_size(rec[2], scope))

    def cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        item = self.task_of(conn, args)
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        if not item.terminal:
            self.endings.finish(now, item, Event.CANCEL, None, reason or "cancelled")
        return item.view()


def _subscribing(item: Item, subscriber: str, scope: str | None) -> int:
    """How many more stored bytes ``item`` holds once ``subscriber`` is subscribed with
    ``scope`` (a subscriber already there changes only its scope)."""
    subscribers = item.subscribers
    if subscriber in subscribers:
        return subscription_size(subscriber, scope) - subscription_size(
            subscriber, subscribers[subscriber]
        )
    return subscription_size(subscriber, scope)


class ResultWait(Wait):
    """A ``result`` call parked until its task ends; ``outcome_only``: answered with the
    task's ``outcome_view`` instead of its whole view."""

    __slots__ = ("item", "outcome_only")

    def __init__(
        self, item: Item, conn: int, rid: int, deadline: float, since: float,
        outcome_only: bool = False,
    ) -> None:
        super().__init__(conn, rid, deadline, since)
        self.item = item
        self.outcome_only = outcome_only

    def withdraw(self) -> None:
        item = self.item
        watchers = item.watchers
        if watchers is self:  # the task's only watcher: no line was made
            item.watchers = ()
            return
        assert isinstance(watchers, WaitLine)
        watchers.withdraw(self)
        if not watchers:
            item.watchers = ()

    def timeout_message(self) -> str:
        return f"task {self.item.id} had not finished when the wait timed out"
