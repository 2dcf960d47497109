"""Tasks after submission: tickets, result waits, endings, retention, forgetting.

What always holds:
- an item ends once, through ``finish``, with one FINISHED record; an ending that takes
  a delivery away from a live worker (cancel, deadline) pushes LEASE_LOST to it;
- a terminal task pushes its result to every pending ``result`` wait at once;
- a task keeps its outcome for the retention window, is then tombstoned (state and
  reason kept, outcome and data dropped), and is forgotten once the tombstone window
  has passed too, so memory stays bounded; a message is forgotten as soon as it ends;
- a task with no subscribers keeps going: only cancel (or its run's) stops it;
- a task's reads (status, result, join, detach, cancel) name it by scope and id;
  another scope's task, and another tenant's, is NOT_FOUND with the message a task
  that does not exist gets.
Deadlines, retention and tombstone windows are wall-clock instants (``now +
wall_offset``) so that they mean the same after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits, Op, Push

from .deliveries import Deliveries
from .dueline import DueLine
from .effects import DEFERRED
from .errors import CoreError
from .items import STATE_BY_NAME, Event, Item, transition
from .leases import Lease
from .payloads import subscription_size
from .records import Rec
from .scopes import Scope
from .tables import Applier, Handler, Tables
from .tally import tally
from .validate import opt_number, opt_text, req_text
from .waits import ResultWait, WaitLine
from .work import Work

if TYPE_CHECKING:
    from .groups import GroupBook

__all__ = ["Tasks"]

_TAKES_THE_DELIVERY = (Event.CANCEL, Event.DEADLINE)
_FINISHED = Rec.FINISHED  # (an enum member is a class attribute lookup: hot path)


class Tasks:
    """Task tickets and every item's ending. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, deliveries: Deliveries) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.groups: GroupBook  # wired by the Core: a member's ending may answer waits
        # Finished tasks in finishing order: retained, then tombstoned (each instant is
        # the finishing time plus a constant), one wheel entry per line (dueline.py).
        self.retained = DueLine(tables, self._retention_due)
        self.tombstones = DueLine(tables, self._forget_due)
        self.ops: dict[int, Handler] = {
            Op.TASK_STATUS: self.status,
            Op.TASK_RESULT: self.result,
            Op.TASK_JOIN: self.join,
            Op.TASK_DETACH: self.detach,
            Op.TASK_CANCEL: self.cancel,
        }
        self.appliers: dict[int, Applier] = {
            Rec.FINISHED: self.apply_finished,
            Rec.SUBSCRIBED: self.apply_subscription,
            Rec.DETACHED: self.apply_subscription,
            Rec.TOMBSTONED: self.apply_tombstoned,
            Rec.FORGOTTEN: self.apply_forgotten,
        }

    # ---- tickets ---------------------------------------------------------------------

    def _task(self, conn: int, args: dict[str, Any]) -> Item:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        task_id = req_text(args, "task", Limits.MAX_KEY_BYTES)
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
        return self._task(conn, args).view()

    def result(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        item = self._task(conn, args)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        if item.terminal:
            return item.view()
        if timeout_ms == 0:
            raise CoreError(ErrorCode.WAIT_TIMEOUT, f"task {item.id} has not finished")
        watcher = ResultWait(item, conn, rid, now + timeout_ms / 1000.0, now)
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
        item = self._task(conn, args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        subscriber_scope = opt_text(args, "subscriber_scope", Limits.MAX_SCOPE_ID_BYTES)
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
        self.tables.commit((Rec.SUBSCRIBED, item.id, subscriber, scope), now)

    def detach(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Unsubscribe. A task with no subscribers keeps going: only cancel stops it."""
        item = self._task(conn, args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        if subscriber in item.subscribers:
            self.tables.commit((Rec.DETACHED, item.id, subscriber), now)
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
        item = self._task(conn, args)
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        if not item.terminal:
            self.finish(now, item, Event.CANCEL, None, reason or "cancelled")
        return item.view()

    def scope_cancelled(self, now: float, scope: Scope, items: Iterable[Item]) -> int:
        """A run was cancelled: ``items``, a slice of those it had unfinished, end
        CANCELLED (one that ended meanwhile is passed over). Returns how many ended."""
        count = 0
        for item in items:
            if item.terminal or scope.live_items.get(item.id) is not item:
                continue
            if item.delivery is not None:
                self.deliveries.remember_cancelled(item.delivery, scope)
            self.finish(
                now, item, Event.CANCEL, None, f"run cancelled: {scope.cancelled}",
                lost_reason="scope cancelled",
            )
            count += 1
        return count

    # ---- endings ---------------------------------------------------------------------

    def finish(
        self, now: float, item: Item, event: Event, outcome: Any, reason: str | None,
        *, dead: bool = False, lost_reason: str | None = None,
        settled_by: Event | None = None,
    ) -> None:
        """End ``item`` (``settled_by``: the kind of its own delivery's settlement that
        ends it, remembered to answer a repeat; None for any other ending)."""
        tables = self.tables
        state = transition(item.state, event)
        rec: tuple[Any, ...] = (
            (_FINISHED, item.id, state._value_, outcome, reason, tables.wall(now), dead)
            if settled_by is None else
            (_FINISHED, item.id, state._value_, outcome, reason, tables.wall(now), dead,
             settled_by._value_)
        )
        lease = tables.commit(rec, now)
        if dead:
            tables.effects.note(
                "dead letter", scope=item.scope, mailbox=item.mailbox, item=item.id,
                attempt=item.attempt, reason=reason,
            )
        if lease is not None and event in _TAKES_THE_DELIVERY:
            if lost_reason is None:
                lost_reason = "cancelled" if event is Event.CANCEL else "deadline"
            tables.effects.push(
                lease.conn, Push.LEASE_LOST, {"lease": lease.handle, "reason": lost_reason}
            )
        watchers = item.watchers
        if type(watchers) is not tuple:  # the view is built only for someone waiting on it
            item.watchers = ()
            waiting = watchers.take() if type(watchers) is WaitLine else (watchers,)
            view = item.view()
            served, reply = tables.waits.served, tables.effects.reply
            for watcher in waiting:
                served(watcher)
                reply(watcher.conn, watcher.request_id, view)
        if item.group is not None:
            self.groups.ended(now, item)

    def apply_finished(self, rec: tuple[Any, ...], now: float) -> Lease | None:
        if len(rec) == 7:
            _, item_id, state, outcome, reason, finished_at, dead = rec
            settled_by = None
        else:  # its own delivery's settlement ended it: remembered below
            _, item_id, state, outcome, reason, finished_at, dead, settled_by = rec
        size = self.work.sized(outcome)  # consumed first, whatever happens next
        items = self.work.items
        item = items.get(item_id)
        if item is None or item.terminal:
            return None
        old = item.state
        self.work.set_state(item, STATE_BY_NAME[state])
        tally(item, old, item.state)
        item.outcome = outcome
        if size:
            item.size += size
            self.tables.tenants.charge(item.tenant, size)
        item.reason = reason  # explains non-successful endings only
        item.finished_at = finished_at
        work = self.work
        # A live task's run is the one that counts it (placed there); a message's is found.
        scope = item.run or self.tables.scope_for(item.tenant, item.scope)
        queue = scope.queues.get(item.mailbox)
        if queue is not None:
            queue.drop(item)
        self.deliveries.blocked.forget(item)
        lease = self.deliveries.end_delivery(item, queue)
        if lease is not None and settled_by is not None:
            self.deliveries.settled.remember(
                now, item.tenant, lease.handle, settled_by, item_id, state, None,
                finished_at + lease.length,
            )
        # Its timers leave the wheel now: the deadline, and the end of a retry backoff.
        if item.deadline is not None:
            self.tables.cancel_at_wall(item.deadline, self._deadline_due, item_id)
        if item.visible_at:
            self.tables.cancel_at_wall(item.visible_at, self.deliveries.visible_due, item_id)
        scope.live_items.pop(item_id, None)
        if dead:
            item.dead = True
            work.add_dead_letter(work.queue_of(scope, item.mailbox), {
                "id": item.id,
                "kind": "message" if item.is_message else "task",
                "key": item.key,
                "data": item.data,
                "attempt": item.attempt,
                "reason": item.reason,
                "at": finished_at,
            }, item.size)  # its data: no outcome yet (a dead ending records none)
        if item.is_message:
            work.drop_item(item)  # nobody can ask for a message's result
        else:
            self.retained.add(finished_at + self.work.retention_seconds, item)
        work.release_in(scope, item.mailbox)
        return lease

    def schedule_ending(self, item: Item) -> None:
        """For an item placed already terminal (from a snapshot): its next step, the
        tombstone or the forgetting, at its wall-clock instant."""
        if item.finished_at is None:
            return
        if not item.tombstoned:
            self.retained.add(item.finished_at + self.work.retention_seconds, item)
        else:
            self.tombstones.add(self._forget_at(item), item)

    def watch_deadline(self, item: Item) -> None:
        if item.deadline is not None:
            self.tables.at_wall(item.deadline, self._deadline_due, item.id)

    def _deadline_due(self, now: float, item_id: str) -> None:
        item = self.work.items.get(item_id)
        if item is None or item.terminal:
            return
        if item.deadline is not None and self.tables.after(item.deadline, now):
            self.tables.at_wall(item.deadline, self._deadline_due, item_id)
            return
        self.finish(now, item, Event.DEADLINE, None, "deadline passed before the task finished")

    # ---- retention, tombstones, forgetting -------------------------------------------

    def _retention_due(self, now: float, item: Item) -> None:
        if item.tombstoned or item.finished_at is None:
            return
        self.tables.commit((Rec.TOMBSTONED, item.id), now)

    def apply_tombstoned(self, rec: tuple[Any, ...], now: float) -> None:
        item = self.work.items.get(rec[1])
        if item is not None and item.terminal and not item.tombstoned:
            item.tombstoned = True
            self.work.free_payloads(item)
            if item.finished_at is not None:
                self.tombstones.add(self._forget_at(item), item)

    def _forget_at(self, item: Item) -> float:
        assert item.finished_at is not None
        work = self.work
        return item.finished_at + work.retention_seconds + work.tombstone_seconds

    def _forget_due(self, now: float, item: Item) -> None:
        """The tombstone window has passed too: forget the task, so memory stays bounded."""
        if self.work.items.get(item.id) is not item:
            return
        self.tables.commit((Rec.FORGOTTEN, item.id), now)
        if item.group is not None:
            self.groups.forgotten(item, item.state)

    def apply_forgotten(self, rec: tuple[Any, ...], now: float) -> None:
        item = self.work.items.get(rec[1])
        if item is None or not item.tombstoned:
            return
        self.work.drop_item(item)
        tally(item, item.state, None)
        scope = self.tables.find_scope(item.tenant, item.scope)
        if scope is not None:
            if item.key is not None and scope.tasks.get(item.key) is item:
                del scope.tasks[item.key]
            self.tables.release_scope(scope)


def _subscribing(item: Item, subscriber: str, scope: str | None) -> int:
    """How many more stored bytes ``item`` holds once ``subscriber`` is subscribed with
    ``scope`` (a subscriber already there changes only its scope)."""
    subscribers = item.subscribers
    if subscriber in subscribers:
        return subscription_size(subscriber, scope) - subscription_size(
            subscriber, subscribers[subscriber]
        )
    return subscription_size(subscriber, scope)
