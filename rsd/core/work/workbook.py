"""The work tables: what intake, deliveries, settlement and tasks share.

``Work`` holds the tables the work books share (mailboxes, items, the item counter, the
retention options), answers "which queue does this request name", serves the queue
reads (QUEUE_INSPECT, DEAD_LETTERS) and writes the queues' snapshot. The queues
themselves (ready line, parked consumers, dedupe, dead letters) are queue.py's.

What always holds:
- a request names a queue by (scope, mailbox) within its connection's tenant: mailbox
  definitions are keyed ``(tenant, name)`` and scopes ``(tenant, scope id)``, so
  another tenant's mailbox or run is, for it, one that does not exist (tenants.py);
- a mailbox never ensured (by this tenant) is NOT_FOUND, and
  a change in a cancelled run is SCOPE_CANCELLED; reads create nothing, and neither does
  a request that puts nothing in the queue (a receive that finds nothing): a queue is
  made by the record that puts an item, dedupe entry or dead letter in it, or by a
  consumer that parks on it;
- a queue holding nothing (no ready item, consumer, running delivery, dedupe entry or
  dead letter) is freed, and so is a scope left holding nothing (``release``);
- an item id is taken for good only when the record that uses it is applied;
- an item in the table is charged to its tenant's stored bytes for its payloads
  (``Item.size``: data, then its outcome too), from ``add_item`` until it is tombstoned
  (``free_payloads``) or dropped; the size is the one its handler measured, carried
  in the record (ITEM_ENQUEUED's data_size, FINISHED's outcome_size), measured again
  only for a record that lacks it;
- ``by_state`` counts the items of the table by (is_message, state), changed only by
  ``add_item``, ``drop_item`` and ``set_state``: so the server reads states in O(1),
  with no walk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ...policy import Policy
from ..ground.errors import CoreError
from ..ground.ids import Counters
from ..ground.pages import PagedIndex
from ..ground.payloads import payload_size, stored_size, subscriptions_size
from ..ground.validate import opt_number, req_text
from ..records import MailboxEnsured, MailboxPaused, Rec
from ..records.itemrecords import DebounceKeyed
from ..records.snaprecords import SnapDeadLetter, SnapDedupe
from ..run.items import TERMINAL, Item, State, gathered, item_record, queued_record
from ..run.links import links_records
from ..run.queue import Queue
from ..run.scope import Scope, ScopeKey
from ..run.signals import signals_record
from ..state.tables import Applier, Handler, Tables
from ..tenant.mailbox import Mailbox
from .keylimits import KeyLimits

__all__ = ["Work"]

_MAX_SCOPE_ID_BYTES: Final = Limits.MAX_SCOPE_ID_BYTES
_MAX_MAILBOX_NAME_BYTES: Final = Limits.MAX_MAILBOX_NAME_BYTES

_DELAYED: Final = State.DELAYED
_WAITING: Final = State.WAITING
_BLOCKED: Final = State.BLOCKED
_MAX_KEYS = Policy.MAX_FAIRNESS_KEYS_PER_MAILBOX

# ``by_state``'s keys, each tuple made once, by is_message then state: compiled, a key
# written ``(item.is_message, state)`` is a new tuple at each use (two an update).
_TASK_KEYS: Final[dict[State, Any]] = {state: (False, state) for state in State}
_MESSAGE_KEYS: Final[dict[State, Any]] = {state: (True, state) for state in State}


class Work:
    """The tables shared by mailboxes, intake, deliveries and tasks, and the queue reads
    (QUEUE_INSPECT, DEAD_LETTERS). Owned by the Core."""

    def __init__(
        self,
        tables: Tables,
        retention_seconds: float,
        dedupe_seconds: float,
        tombstone_seconds: float,
    ) -> None:
        self.tables = tables
        self.retention_seconds = retention_seconds
        self.dedupe_seconds = dedupe_seconds
        self.tombstone_seconds = tombstone_seconds
        self.mailboxes: dict[tuple[str, str], Mailbox] = {}  # (tenant, name) -> definition
        self.items: dict[str, Item] = {}
        self.by_state: dict[tuple[bool, State], int] = {  # (is_message, state) -> items
            (is_message, state): 0 for is_message in (False, True) for state in State
        }
        self.item_ids = Counters()  # item-id namespace -> its next number (ids.py)
        self.queue_scopes: set[ScopeKey] = set()  # scopes that have a queue
        self.queue_count = 0  # queues in all scopes (a counter, for stats)
        self.ops: dict[int, Handler] = {
            Op.QUEUE_INSPECT: self.inspect,
            Op.DEAD_LETTERS: self.dead_letter_list,
        }
        self.keys = KeyLimits(tables, self.items)  # limits by key (keylimits.py)
        self.appliers: dict[int, Applier] = {
            Rec.SNAP_DEAD_LETTER: self.apply_snapshot_dead_letter,
            **self.keys.appliers,
        }

    # ---- the item table: every item counts in its tenant's usage while it is in it ----

    def add_item(self, item: Item) -> None:
        self.items[item.id] = item
        usage = self.tables.tenants.of_tenant(item.tenant)
        usage.items += 1
        usage.bytes += item.size
        key = (_MESSAGE_KEYS if item.is_message else _TASK_KEYS)[item.state]
        self.by_state[key] += 1
        if item.fairness_key is not None and not item.terminal:
            keys = self.mailboxes[(item.tenant, item.mailbox)].fairness_keys
            keys[item.fairness_key] = keys.get(item.fairness_key, 0) + 1

    def drop_item(self, item: Item) -> None:
        if self.items.get(item.id) is item:
            del self.items[item.id]
            usage = self.tables.tenants.of_tenant(item.tenant)
            usage.items -= 1
            usage.bytes -= item.size
            item.size = 0
            if item.subscribers:  # a task's, each subscribed by a request of its own
                usage.bytes -= subscriptions_size(item.subscribers)
            self.by_state[(item.is_message, item.state)] -= 1
            scope = self.tables.find_scope(item.tenant, item.scope)
            if scope is not None and scope.item_pages is not None:
                scope.item_pages.removed()

    def free_payloads(self, item: Item) -> None:
        """``item`` drops its data and outcome (tombstoned): its tenant gets their bytes back."""
        self.tables.tenants.charge(item.tenant, -item.size)
        item.size = 0
        item.outcome = None
        item.data = None
        if item.events is not None:  # its retained events (their bytes were in its size)
            item.events.forget()  # (their seqs go on: the outcome keeps its own)

    def index_item(self, item: Item, scope: Scope | None = None) -> None:
        """List ``item`` in its run's admin index (pages.py), if its run exists
        (``scope``: that run, when the caller has it at hand)."""
        if scope is None:
            scope = self.tables.find_scope(item.tenant, item.scope)
            if scope is None:
                return
        pages = scope.item_pages
        if pages is None:
            pages = scope.item_pages = PagedIndex(self._item_alive)
        pages.add(item)

    def _item_alive(self, item: Item) -> bool:
        return self.items.get(item.id) is item

    def set_state(self, item: Item, state: State) -> None:
        """Every state change of an item in the table goes through here (the counts,
        its queue's DELAYED count too; a task with retained events keeps the change as
        an event but its end, which is its outcome: eventlog.py)."""
        by_state = self.by_state
        old = item.state
        state_keys = _MESSAGE_KEYS if item.is_message else _TASK_KEYS
        old_key = state_keys[old]
        new_key = state_keys[state]
        by_state[old_key] -= 1
        by_state[new_key] += 1
        item.state = state
        log = item.events
        if log is not None and state not in TERMINAL:
            event, change = log.state(state._value_, item.attempt)
            if change:
                item.size += change
                self.tables.tenants.charge(item.tenant, change)
            for heard in self.tables.events.item_event.listeners:
                heard(item, event)
        if old is _DELAYED:  # (it leaves: due, cancelled or expired; its queue was kept)
            self.queue_of_item(item).delayed -= 1
        elif old is _WAITING:  # (signalled, timed out, cancelled or expired; likewise)
            self.queue_of_item(item).waiting -= 1
        elif old is _BLOCKED:  # (its parents ended: let go, or cancelled; likewise)
            self.queue_of_item(item).blocked_by_parents -= 1
        if item.fairness_key is not None and state in TERMINAL and old not in TERMINAL:
            keys = self.mailboxes[(item.tenant, item.mailbox)].fairness_keys
            left = keys[item.fairness_key] - 1
            if left:
                keys[item.fairness_key] = left
            else:
                del keys[item.fairness_key]

    def delay(self, item: Item, queue: Queue | None = None) -> None:
        """A DELAYED ``item`` placed: its queue counts it (and is kept while it does)."""
        if queue is None:
            queue = self.queue_of_item(item)
        queue.delayed += 1

    def wait(self, item: Item, queue: Queue | None = None) -> None:
        """A WAITING ``item`` placed: its queue counts it (and is kept while it does)."""
        if queue is None:
            queue = self.queue_of_item(item)
        queue.waiting += 1

    def block(self, item: Item, queue: Queue | None = None) -> None:
        """A BLOCKED ``item`` placed: its queue counts it (and is kept while it does)."""
        if queue is None:
            queue = self.queue_of_item(item)
        queue.blocked_by_parents += 1

    def charge_signals(self, item: Item, size: int) -> None:
        """``item``'s signals hold ``size`` more stored bytes (fewer, if negative): its
        tenant is charged for them (run/signals.py)."""
        if size:
            item.signals.bytes += size
            self.tables.tenants.charge(item.tenant, size)

    def drop_signals(self, item: Item) -> None:
        """``item`` ended: its signals go, and its tenant gets their bytes back."""
        signals = item.signals
        if signals is not None:
            item.signals = None
            if signals.bytes:
                self.tables.tenants.charge(item.tenant, -signals.bytes)

    def room_for_item(self, tenant: str, scope: Scope | None, size: int = 0) -> None:
        """Refuse (RESOURCE_EXHAUSTED) a new item (of ``size`` stored payload bytes) its
        tenant has no room for, or whose run does not exist yet (its record will make
        it) when the tenant has no room for another run."""
        tenants = self.tables.tenants
        usage = tenants.usage.get(tenant)
        limits = tenants.limits
        if (  # clearly within both limits: no call (else the calls refuse with the figures)
            usage is None
            or usage.items >= limits.items
            or (size and usage.bytes + size > tenants.byte_limits.get(tenant, limits.payload_bytes))
        ):
            tenants.room(tenant, "items")
            tenants.room_for_bytes(tenant, size)
        if scope is None:
            tenants.room(tenant, "runs")

    def room_for_key(self, tenant: str, name: str, fairness_key: str | None) -> None:
        """Refuse (RESOURCE_EXHAUSTED) a new item whose fairness key would be one live
        key more than the mailbox ``name`` may have (``Policy``). O(1)."""
        if fairness_key is None:
            return
        keys = self.mailboxes[(tenant, name)].fairness_keys
        if fairness_key not in keys and len(keys) >= _MAX_KEYS:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"mailbox {name!r} has {len(keys)} live fairness keys, the most it may "
                f"have ({_MAX_KEYS}); reuse a key, or wait for items of others to finish",
                {"limit": _MAX_KEYS},
            )

    def new_id(self, prefix: str, tenant: str) -> str:
        """``tenant``'s next item id; taken for good when the record that uses it is
        applied."""
        return self.item_ids.new_item_id(prefix, tenant)

    # ---- which queue -----------------------------------------------------------------

    def address(self, conn: int, args: dict[str, Any]) -> tuple[str, str, str]:
        """The (tenant, scope id, mailbox) a request names; NOT_FOUND for a mailbox this
        tenant never ensured (another tenant's is the same: not there)."""
        scope_id = req_text(args, "scope", _MAX_SCOPE_ID_BYTES)
        name = req_text(args, "mailbox", _MAX_MAILBOX_NAME_BYTES)
        tenant = self.tables.tenant_of(conn)
        if (tenant, name) not in self.mailboxes:
            raise CoreError(
                ErrorCode.NOT_FOUND,
                f"mailbox {name!r} does not exist; create it with mailboxes.ensure first",
            )
        return tenant, scope_id, name

    def to_change(
        self, conn: int, args: dict[str, Any]
    ) -> tuple[str, str, str, Scope, Queue | None]:
        """For changes: the (tenant, scope id, mailbox) named, with the run (which
        must exist: NOT_FOUND otherwise) and the queue if it exists; refused in a
        cancelled run. Creates no queue: the record that puts something in it does."""
        tenant, scope_id, name = self.address(conn, args)
        scope = self.tables.run(tenant, scope_id)
        scope.refuse_if_cancelled()
        return tenant, scope_id, name, scope, scope.queues.get(name)

    def mailbox_of(self, item: Item) -> Mailbox:
        return self.mailboxes[(item.tenant, item.mailbox)]

    def find_queue(self, tenant: str, scope_id: str, name: str) -> Queue | None:
        scope = self.tables.find_scope(tenant, scope_id)
        return scope.queues.get(name) if scope is not None else None

    def queue_to_read(self, conn: int, args: dict[str, Any]) -> Queue:
        """For reads: the queue if it exists, else an empty one; creates nothing. The
        run must exist (NOT_FOUND otherwise)."""
        tenant, scope_id, name = self.address(conn, args)
        queue = self.tables.run(tenant, scope_id).queues.get(name)
        if queue is None:  # (with its mailbox's depth: a pause for every run shows)
            queue = Queue(tenant, scope_id, name, self.mailboxes[(tenant, name)].depth)
        return queue

    def queue_of(self, scope: Scope, name: str) -> Queue:
        queue = scope.queues.get(name)
        if queue is None:
            box = self.mailboxes.get((scope.tenant, name))
            queue = scope.queues[name] = Queue(
                scope.tenant, scope.id, name, None if box is None else box.depth
            )
            self.queue_count += 1
            self.queue_scopes.add(scope.key)
            pages = scope.queue_pages  # the run's mailboxes, for ADMIN_QUEUES (admin.py)
            if pages is None:
                queues = scope.queues
                pages = scope.queue_pages = PagedIndex(lambda q: queues.get(q.mailbox) is q)
            pages.add(queue)
        return queue

    def queue_of_item(self, item: Item) -> Queue:
        """The queue of a live item. A task's run is ``item.run`` (placed there, and a
        run holding a live item is never freed); a message's is looked up."""
        scope = item.run
        if scope is None:
            scope = self.tables.scope_for(item.tenant, item.scope)
        return self.queue_of(scope, item.mailbox)

    def release(self, tenant: str, scope_id: str, name: str) -> None:
        """Free the queue (scope, name) if it holds nothing, then the scope if it holds
        nothing. Called wherever a queue may have become empty. O(1)."""
        scope = self.tables.find_scope(tenant, scope_id)
        if scope is not None:
            self.release_in(scope, name)

    def release_in(self, scope: Scope, name: str) -> None:
        """``release`` of the queue ``name`` of ``scope`` (the run in the table)."""
        queue = scope.queues.get(name)
        if queue is not None and queue.holds_nothing():
            del scope.queues[name]
            if queue.depth.parked:  # (kept by a paused mailbox: pauses.py)
                queue.depth.parked.pop(queue, None)
            self.queue_count -= 1
            if scope.queue_pages is not None:
                scope.queue_pages.removed()
            if not scope.queues:
                self.queue_scopes.discard(scope.key)
        if not scope.queues:  # a run with a queue holds something: no call to find that
            self.tables.release_scope(scope)

    # ---- queue reads -----------------------------------------------------------------

    def inspect(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        return self.queue_to_read(conn, args).counts()

    def dead_letter_list(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        queue = self.queue_to_read(conn, args)
        return self.dead_letter_page(queue, args)

    @staticmethod
    def dead_letter_page(queue: Queue, args: dict[str, Any]) -> dict[str, Any]:
        """The newest ``limit`` dead letters of ``queue`` that fit in one reply frame
        (DEAD_LETTERS, ADMIN_DEAD_LETTERS): at most MAX_DEAD_LETTERS entries looked at."""
        limit = int(opt_number(args, "limit", 100, 1, Limits.MAX_DEAD_LETTERS))
        # Newest last, as many as fit in one reply frame (payloads are up to 256 KiB).
        budget = Policy.PAGE_PAYLOAD_BYTES
        items: list[dict[str, Any]] = []
        truncated = False
        for entry in reversed(queue.dead_letters):
            if len(items) == limit:
                break
            budget -= payload_size(entry)
            if budget < 0:
                truncated = True
                break
            items.append(entry)
        items.reverse()
        return {"items": items, "truncated": truncated}

    # ---- snapshots -------------------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """Records that rebuild every mailbox, item, dedupe entry and dead letter: ready
        items first, in their queues' order, so that a rebuilt line keeps its order."""
        for mailbox in self.mailboxes.values():
            yield MailboxEnsured(
                Rec.MAILBOX_ENSURED, mailbox.name, mailbox.mode, mailbox.max_attempts,
                mailbox.retry_backoff_ms, mailbox.tenant,
            )
            if mailbox.depth.paused:
                yield MailboxPaused(
                    Rec.MAILBOX_PAUSED, mailbox.name, mailbox.tenant, None, True
                )
        emitted: set[str] = set()
        for entry in gathered(self._items_in_queue_order()):
            if type(entry) is not Item:  # plainly queued items: one record for all
                emitted.update(item.id for item in entry)
                yield queued_record(entry)
                continue
            emitted.add(entry.id)
            yield from _item_records(entry)
        bound = self.tables.leases.bound
        for item in self.items.values():
            if item.id not in emitted:
                delivery = item.delivery
                yield from _item_records(
                    item, delivery is not None and delivery.handle in bound
                )
        for scope in list(self._scopes_with_queues()):
            yield from self._queue_memories(scope)
        yield from links_records(self.items.values())  # (after every item: parents.py)
        yield from self.keys.snapshot()  # after the tasks that carry the keys

    def run_snapshot(self, scope: Scope) -> Iterator[tuple[Any, ...]]:
        """Records that rebuild ``scope``'s items, dedupe entries and dead letters (a
        moved run's, transfer.py), and the declarations of the mailboxes its queues
        use: as ``snapshot`` writes them, ready lines first in their order. O(the
        run's items): its admin index holds every item the server knows of it."""
        for name in scope.queues:
            mailbox = self.mailboxes.get((scope.tenant, name))
            if mailbox is not None:
                yield MailboxEnsured(
                    Rec.MAILBOX_ENSURED, mailbox.name, mailbox.mode, mailbox.max_attempts,
                    mailbox.retry_backoff_ms, mailbox.tenant,
                )
        emitted: set[str] = set()
        line = (item for queue in scope.queues.values() for item in queue.queued())
        for entry in gathered(line):
            if type(entry) is not Item:
                emitted.update(item.id for item in entry)
                yield queued_record(entry)
                continue
            emitted.add(entry.id)
            yield from _item_records(entry)
        bound = self.tables.leases.bound
        pages = scope.item_pages
        for item in [] if pages is None else pages.live():
            if item.id not in emitted:
                delivery = item.delivery
                yield from _item_records(
                    item, delivery is not None and delivery.handle in bound
                )
        yield from self._queue_memories(scope)
        yield from links_records([] if pages is None else pages.live())
        yield from self.keys.run_snapshot(scope)  # after the tasks that carry the keys

    def _queue_memories(self, scope: Scope) -> Iterator[tuple[Any, ...]]:
        """The dedupe entries, dead letters, pauses and debounce keys of ``scope``'s
        queues."""
        for queue in scope.queues.values():
            if queue.paused:
                yield MailboxPaused(
                    Rec.MAILBOX_PAUSED, queue.mailbox, scope.tenant, scope.id, True
                )
            for key, (item_id, digest, until) in queue.dedupe.items():
                yield SnapDedupe(
                    Rec.SNAP_DEDUPE, scope.id, queue.mailbox, key, item_id, digest, until,
                    scope.tenant,
                )
            for dead in queue.dead_letters:
                yield SnapDeadLetter(
                    Rec.SNAP_DEAD_LETTER, scope.id, queue.mailbox, dead, scope.tenant
                )
            for key, item in queue.debounced.items():  # (after its item: debounce.py)
                yield DebounceKeyed(Rec.DEBOUNCE_KEYED, item.id, key)

    def _scopes_with_queues(self) -> Iterator[Scope]:
        for tenant, scope_id in sorted(self.queue_scopes):
            scope = self.tables.find_scope(tenant, scope_id)
            if scope is not None:
                yield scope

    def _items_in_queue_order(self) -> Iterator[Item]:
        for scope in self._scopes_with_queues():
            for queue in scope.queues.values():
                yield from queue.queued()

    def apply_snapshot_dead_letter(self, rec: SnapDeadLetter, now: float) -> None:
        _, scope_id, mailbox, entry, tenant = rec
        self.add_dead_letter(
            self.queue_of(self.tables.scope_for(tenant, scope_id), mailbox), entry,
            stored_size(entry["data"]),
        )

    def add_dead_letter(self, queue: Queue, entry: dict[str, Any], size: int) -> None:
        """Keep ``entry`` (whose data is ``size`` stored bytes) in ``queue``'s dead letters,
        charged to its tenant on top of the item it came from (a dead letter outlives a
        task's retention): never refused, an item ends once."""
        self.tables.tenants.charge(queue.tenant, queue.add_dead_letter(entry, size))


def _item_records(item: Item, bound: bool = False) -> Iterator[tuple[Any, ...]]:
    """``item``'s SNAP_ITEM, then its SNAP_TASK_EVENTS if it has retained events
    (work/progress.py) and its SNAP_SIGNALS if it has signals (run/signals.py)."""
    yield item_record(item, bound)
    if item.limits is not None and not item.terminal:  # its keys (keylimits.py)
        yield KeyLimits.record(item.id, item.limits.keys)
    if item.events is not None:
        yield item.events.record(item.id)
    if item.signals is not None:
        yield signals_record(item.id, item.signals)
