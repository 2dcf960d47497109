"""How an item ends, and what follows: one FINISHED record per item, result pushes,
deadlines, retention, tombstones and forgetting.

What always holds:
- an item ends once, through ``finish``, with one FINISHED record; an ending that takes
  a delivery away from a live worker (cancel, deadline) tells it (LEASE_LOST,
  ``Effects.lease_lost``); the ending is announced (``item_ended``, events.py);
- a terminal task pushes its result to every pending ``result`` wait at once (its whole
  view, or its outcome view to a wait that asked for ``outcome_only``);
- a task keeps its outcome for the retention window, is then tombstoned (state and
  reason kept, outcome and data dropped), and is forgotten once the tombstone window
  has passed too (``item_forgotten``), so memory stays bounded; a message is forgotten
  as soon as it ends;
- a task whose deadline passes before it ends ends EXPIRED.
Deadlines, retention and tombstone windows are wall-clock instants (wallclock.py) so
that they mean the same after a restart. Who decides that an item
ends is elsewhere: settlement.py (its worker), tasks.py (TASK_CANCEL), cascade.py (its
run's cancellation), intake.py (a deadline already past).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, cast

from ..ground.dueline import DueLine
from ..ground.leases import Lease
from ..ground.payloads import stored_size
from ..ground.waits import Wait, WaitLine
from ..records import Rec
from ..records.itemrecords import Finished, Forgotten, Tombstoned, built
from ..run.items import STATE_BY_NAME, Event, Item, transition
from ..run.links import forget_child
from ..run.scope import Scope
from ..run.tally import tally
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .settled import Settled
from .workbook import Work

__all__ = ["Endings"]

_TAKES_THE_DELIVERY: Final = (Event.CANCEL, Event.DEADLINE)
_FINISHED: Final[Literal[Rec.FINISHED]] = Rec.FINISHED  # (an enum member: a class lookup; hot path)


class Endings:
    """Every item's ending and its afterlife. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, settled: Settled
    ) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.settled = settled
        self.events = tables.events
        # Finished tasks in finishing order: retained, then tombstoned (each instant is
        # the finishing time plus a constant), one wheel entry per line (dueline.py).
        self.retained = DueLine(tables.clock, self._retention_due)
        self.tombstones = DueLine(tables.clock, self._forget_due)
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {
            Rec.FINISHED: self.apply_finished,
            Rec.TOMBSTONED: self.apply_tombstoned,
            Rec.FORGOTTEN: self.apply_forgotten,
        }

    def cancel_slice(self, now: float, scope: Scope, items: Iterable[Item]) -> int:
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
        settled_by: Event | None = None, outcome_size: int = -1,
    ) -> None:
        """End ``item`` (``settled_by``: the kind of its own delivery's settlement that
        ends it, remembered to answer a repeat; None for any other ending;
        ``outcome_size``: the stored size of ``outcome`` its handler measured, -1 if
        it did not)."""
        tables = self.tables
        state = transition(item.state, event)
        rec = built(Finished, (
            _FINISHED, item.id, state._value_, outcome, reason, tables.wall(now), dead,
            None if settled_by is None else settled_by._value_, outcome_size,
        ))
        tables.record(rec)  # ``commit``, its applier called natively (Tables.record)
        lease = self.apply_finished(rec, now)
        if dead:
            tables.effects.note(
                "dead letter", scope=item.scope, mailbox=item.mailbox, item=item.id,
                attempt=item.attempt, reason=reason,
            )
        if lease is not None and event in _TAKES_THE_DELIVERY:
            if lost_reason is None:
                lost_reason = "cancelled" if event is Event.CANCEL else "deadline"
            tables.effects.lease_lost(lease, lost_reason)
        watchers = item.watchers
        if type(watchers) is not tuple:  # a view is built only for someone waiting on it
            item.watchers = ()
            waiting = watchers.take() if type(watchers) is WaitLine else (watchers,)
            self._answer_watchers(item, waiting)
        for heard in self.events.item_ended.listeners:  # (no argument packing: hot path)
            heard(now, item)

    def _answer_watchers(self, item: Item, waiting: Iterable[Wait]) -> None:
        """Answer the result waits ``waiting`` on ``item``, which has just ended: each
        with the whole view or, if it asked for ``outcome_only``, the outcome view; each
        kind built once, only if some wait wants it, and shared by those that do. (Each
        a ``Wait``, its waits and effects called as what they are: the compiled core
        reads their fields and calls their methods natively, not by name.)"""
        view: dict[str, Any] | None = None
        outcome: dict[str, Any] | None = None
        tables = self.tables
        waits, effects = tables.waits, tables.effects
        for watcher in waiting:
            waits.served(watcher)
            if cast(Any, watcher).outcome_only:  # (a ResultWait's: work/tasks.py)
                if outcome is None:
                    outcome = item.outcome_view()
                effects.reply(watcher.conn, watcher.request_id, outcome)
            else:
                if view is None:
                    view = item.view()
                effects.reply(watcher.conn, watcher.request_id, view)

    def apply_finished(self, rec: Finished, now: float) -> Lease | None:
        # settled_by: its own delivery's settlement ended it, remembered below
        _, item_id, state, outcome, reason, finished_at, dead, settled_by, size = rec
        items = self.work.items
        item = items.get(item_id)
        if item is None or item.terminal:
            return None
        old = item.state
        self.work.set_state(item, STATE_BY_NAME[state])
        tally(item, old, item.state)
        item.outcome = outcome
        if size < 0:
            size = stored_size(outcome)
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
            if item.debounce_key is not None:  # its key is free (debounce.py)
                queue.let_go(item)
        self.deliveries.blocked.forget(item)
        lease = self.deliveries.end_delivery(item, queue)
        if lease is not None and settled_by is not None:
            self.settled.remember(
                now, item.tenant, lease.handle, settled_by, item_id, state, None,
                finished_at + lease.length,
            )
        # Its timers leave the wheel now: the deadline, and the end of a retry backoff.
        if item.deadline is not None:
            self.tables.cancel_at_wall(item.deadline, self._deadline_due, item_id)
        if item.visible_at:
            self.tables.cancel_at_wall(item.visible_at, self.deliveries.visible_due, item_id)
        scope.live_items.pop(item_id, None)
        if item.signals is not None:  # nothing can take or carry them any more
            work.drop_signals(item)
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
        self.tables.commit(Tombstoned(Rec.TOMBSTONED, item.id), now)

    def apply_tombstoned(self, rec: Tombstoned, now: float) -> None:
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
        self.tables.commit(Forgotten(Rec.FORGOTTEN, item.id), now)
        for heard in self.events.item_forgotten.listeners:  # (no argument packing)
            heard(item, item.state)

    def apply_forgotten(self, rec: Forgotten, now: float) -> None:
        item = self.work.items.get(rec[1])
        if item is None or not item.tombstoned:
            return
        self.work.drop_item(item)
        tally(item, item.state, None)
        if item.links is not None:  # a child leaves its parent's children (parents.py)
            forget_child(item, self.work.items)
        scope = self.tables.find_scope(item.tenant, item.scope)
        if scope is not None:
            if item.key is not None and scope.tasks.get(item.key) is item:
                del scope.tasks[item.key]
            self.tables.release_scope(scope)
