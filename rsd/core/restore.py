"""Restoring a core from records a frame at a time: the fast path for queued items.

A big snapshot is almost all items waiting in a ready line (a pending task or message,
ready now, with no delivery, subscriber or ending): SNAP_QUEUED records, sixteen such
items each (files of format version 4), or one SNAP_ITEM each (older files). Applying
each item through ``Core.apply`` pays for the dispatch, for finding its run, its queue
and its tenant again, and for every count and index moved one by one.
``Restore(core).apply(batch, now)`` applies a frame's records in order and places such
items itself, with what they share looked up once per run of records naming the same
(tenant, run, mailbox); every other record, and every item that does not qualify, goes
through ``Core.apply`` as it is (an item of a SNAP_QUEUED record as its SNAP_ITEM).

What is left per item is building it and three inserts into big dicts (the item table,
its run's tasks and live items), each a cache miss at a million items: recovery's
floor while items are objects.

What always holds:
- the state built is exactly the one ``Core.apply`` builds from the same records, record
  by record (tests/test_restore.py compares every table, count, index and line order,
  and the recovery state machine rebuilds its snapshots through here): the item, its
  place in the item table, its run's tasks and live items, its run's admin index, its
  ready line, the timer of its deadline, and the same strings shared as when it was
  made live (its queue's tenant, run id and mailbox name);
- a qualifying item is placed in O(1); its counts (tenant usage, items by state, the
  run's tally, the mailbox depth) and its ready-line and index entries are added for
  the whole run at once, before any other record is applied, so no applier ever reads
  a count or a line that is behind, and each line keeps the records' order;
- a record applied twice stays harmless: an item already known goes through
  ``Core.apply``, which ignores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .ground.payloads import encode
from .records import Rec
from .records.itemrecords import QueuedRow
from .run.items import QUEUED_FIELDS, Item, State, queued_items

if TYPE_CHECKING:
    from .machine import Core
    from .run.queue import Queue
    from .run.scope import Scope

__all__ = ["Restore"]

_PENDING: Final = State.PENDING.value
_SNAP_ITEM: Final = Rec.SNAP_ITEM
_SNAP_QUEUED: Final = Rec.SNAP_QUEUED


class _Place:
    """Where the queued items of one (tenant, run, mailbox) go, and what they add up to
    while the current run of records lasts."""

    __slots__ = (
        "bytes", "keys", "live", "messages", "plain", "queue", "scope", "tasks", "waiting",
    )

    def __init__(self, scope: Scope, queue: Queue) -> None:
        self.scope = scope
        self.queue = queue
        self.tasks = scope.tasks
        self.live = scope.live_items
        self.waiting: list[Item] = []  # placed, not yet in the ready line, index or counts
        self.messages = 0  # how many of ``waiting`` are messages
        self.bytes = 0  # the stored payload bytes of ``waiting`` (tenants.py)
        self.keys: list[str] = []  # the fairness key of each of ``waiting`` that has one
        self.plain = True  # no item of ``waiting`` has a priority or fairness key


class Restore:
    """Applies records to ``core`` a frame at a time (see the module docstring)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.apply_one = core.apply
        self.work = core.work
        self.tables = core.tables
        self.endings = core.endings
        self._places: dict[tuple[str, str, str], _Place] = {}

    def apply(self, batch: list[Any], now: float) -> None:
        """Apply ``batch``'s records in order, as ``Core.apply`` would one by one."""
        apply_one = self.apply_one
        places = self._places
        wall_now = self.tables.wall(now)
        for rec in batch:
            kind = rec[0]
            if kind == _SNAP_QUEUED:
                _, tenant, scope_id, mailbox, rows, priority, fairness_key = rec
                fields = iter(rows)
                line = list(zip(*[fields] * QUEUED_FIELDS, strict=False))
                done = 0
                while done < len(line):
                    place = places.get((tenant, scope_id, mailbox))
                    if place is None:
                        place = self._place(tenant, scope_id, mailbox)
                    done += self._put(
                        place, line[done:] if done else line, wall_now, priority, fairness_key
                    )
                    if done < len(line):  # one that does not qualify: as its SNAP_ITEM
                        self._settle()
                        apply_one(queued_items(rec)[done], now)
                        done += 1
                continue
            if kind == _SNAP_ITEM:
                (_, item_id, is_message, scope_id, mailbox, key, digest, data, created,
                 deadline, state, attempt, outcome, reason, finished_at, tombstoned, dead,
                 visible_at, subscribers, delivery, tenant, pools, _, not_before, priority,
                 fairness_key, awaiting_due, _, trace) = rec
                if (
                    state == _PENDING and delivery is None and not subscribers
                    and outcome is None and finished_at is None and not tombstoned
                    and not dead and pools is None and not_before is None
                    and not awaiting_due and trace is None
                ):
                    place = places.get((tenant, scope_id, mailbox))
                    if place is None:
                        place = self._place(tenant, scope_id, mailbox)
                    row = QueuedRow(item_id, is_message, key, digest, data, created,
                                    deadline, attempt, reason, visible_at)
                    if self._put(place, (row,), wall_now, priority, fairness_key):
                        continue
            if places:
                self._settle()
            apply_one(rec, now)
        if places:
            self._settle()

    def _put(
        self, place: _Place, line: Sequence[tuple[Any, ...]], wall_now: float,
        priority: int, fairness_key: str | None,
    ) -> int:
        """Place the items of ``line`` (rows of a SNAP_QUEUED record, all of
        ``priority`` and ``fairness_key``) as queued in ``place``, in order, up to the
        first one that does not qualify (its backoff has not passed, or it is known
        already): how many it placed."""
        items = self.work.items
        watch_deadline = self.endings.watch_deadline
        queue = place.queue
        tenant, scope_id, mailbox = queue.tenant, queue.scope, queue.mailbox
        scope = place.scope
        tasks = place.tasks
        live = place.live
        waiting = place.waiting
        new_item = Item
        placed = 0
        if priority or fairness_key is not None:
            place.plain = False
        for (item_id, is_message, key, digest, data, created, deadline, attempt, reason,
             visible_at) in line:  # each a QueuedRow's fields (records.py)
            if visible_at > wall_now or item_id in items:
                break
            item = new_item(
                tenant, item_id, is_message, scope_id, mailbox, key, digest, data, created,
                deadline, None, priority, fairness_key,
            )
            if attempt:
                item.attempt = attempt
            if reason is not None:
                item.reason = reason
            if visible_at:  # else the constructor's 0.0, shared: no float kept per item
                item.visible_at = visible_at
            if fairness_key is not None:
                place.keys.append(fairness_key)
            if data is not None:  # stored_size, inlined: recovery's hot loop
                place.bytes += (size := len(encode(data)))
                item.size = size
            item.queued = True
            items[item_id] = item
            if is_message:
                place.messages += 1
            else:
                if key is not None:
                    tasks[key] = item
                item.run = scope
            live[item_id] = item
            waiting.append(item)
            if deadline is not None:
                watch_deadline(item)
            placed += 1
        return placed

    def _place(self, tenant: str, scope_id: str, mailbox: str) -> _Place:
        """The place of (tenant, run, mailbox), its run and queue made if missing, as
        placing an item one by one makes them."""
        scope = self.tables.scope_for(tenant, scope_id)
        place = _Place(scope, self.work.queue_of(scope, mailbox))
        self._places[(tenant, scope_id, mailbox)] = place
        return place

    def _settle(self) -> None:
        """Add what the items placed since the last call add up to: counts, ready lines
        and admin indexes, in the records' order. Forgets the places (the next record
        may free a queue or a run)."""
        work = self.work
        usage_of = self.tables.tenants.of_tenant
        by_state = work.by_state
        for place in self._places.values():
            waiting = place.waiting
            if not waiting:
                continue
            count = len(waiting)
            messages = place.messages
            tasks = count - messages
            queue = place.queue
            usage = usage_of(queue.tenant)
            usage.items += count
            usage.bytes += place.bytes
            place.bytes = 0
            if messages:
                by_state[(True, State.PENDING)] += messages
            if tasks:
                by_state[(False, State.PENDING)] += tasks
                counts = place.scope.counts
                counts[_PENDING] = counts.get(_PENDING, 0) + tasks
            pages = place.scope.item_pages
            if pages is None:  # the run's index is made by its first item, as live
                work.index_item(waiting[0])
                pages = place.scope.item_pages
                assert pages is not None
                waiting = waiting[1:]
            pages.extend(waiting)
            waiting = place.waiting
            queue.extend(waiting, place.plain)
            place.plain = True
            if place.keys:  # the mailbox's live fairness keys (workbook.py's ``add_item``)
                keys = work.mailboxes[(queue.tenant, queue.mailbox)].fairness_keys
                for key in place.keys:
                    keys[key] = keys.get(key, 0) + 1
                place.keys = []
        self._places.clear()
