"""Intake: how an item enters the books (submit, send, or a snapshot) and where it goes.

What always holds:
- a task is one per (scope, key): the same key with the same input (canonical digest,
  salted with the mailbox) returns the existing task whatever its state, and subscribes
  the caller if it names a subscriber; other input is IDEMPOTENCY_CONFLICT;
- a message's work_key dedupes sends for the dedupe window: the same data again is a
  replay of the first send, other data is IDEMPOTENCY_CONFLICT; the entry is dropped
  (by a DEDUPE_EXPIRED record) when the window passes;
- a message's debounce_key folds sends into the one message of its queue that still
  waits with that key, which goes out once its window passes quietly (debounce.py);
- a task whose deadline has already passed when it is submitted ends EXPIRED at once;
- a new item is handed to a parked consumer in the same call, if one waits (an item with
  ``needs`` only if its capacity is there: blocked.py);
- ``needs`` are part of the input: the same key or work_key with the same data and other
  needs is IDEMPOTENCY_CONFLICT;
- TASK_SUBMIT_MANY is TASK_SUBMIT once per item, in order, through the same code: each
  item is created (or joined) or refused on its own, and its answer is its slim view or
  its error; at most ``Limits.MAX_SUBMIT_BATCH`` items (the frame limit bounds the bytes);
- a placed item is where its state says: live items in their scope, pending ones in
  their ready line (or waiting out their backoff), every wall-clock timer armed.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from .ground.errors import CoreError
from .ground.ids import item_number
from .ground.itemorder import order_args
from .ground.payloads import (
    dedupe_size,
    measured_payload,
    stored_size,
    subscription_size,
    subscriptions_size,
)
from .ground.traces import trace_arg
from .ground.validate import check_number, invalid, opt_bool, opt_text, req_list
from .records import Rec
from .records.itemrecords import DedupeExpired, ItemEnqueued, enqueued
from .records.snaprecords import SnapDedupe, SnapItem, SnapQueued
from .run.items import Event, Item, State, item_from_record, queued_items
from .run.queue import Queue
from .run.scope import Scope
from .run.tally import tally
from .runs.groupbook import GroupBook
from .state.tables import Applier, Handler, Tables
from .tenant.needs import Needs, parse_needs
from .work.blocked import Blocked
from .work.debounce import Debounce, refuse_debounce
from .work.deliveries import Deliveries
from .work.endings import Endings
from .work.keylimits import refuse_keys_on_send
from .work.parents import LinkArgs, Parents, link_args, refuse_links
from .work.tasks import Tasks
from .work.workbook import Work

__all__ = ["Intake"]

_MAX_KEY_BYTES: Final = Limits.MAX_KEY_BYTES
_MAX_SUBSCRIBER_ID_BYTES: Final = Limits.MAX_SUBSCRIBER_ID_BYTES


class Intake:
    """TASK_SUBMIT and MESSAGE_SEND, and the records that create items. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, endings: Endings,
        tasks: Tasks, blocked: Blocked, groups: GroupBook, parents: Parents,
    ) -> None:
        self.tables = tables
        self.parents = parents  # a submit's ``after`` and ``parent`` (work/parents.py)
        self.debounce = Debounce(tables, work, deliveries)  # a send's debounce_key
        self.blocked = blocked
        self.work = work
        self.deliveries = deliveries
        self.endings = endings
        self.tasks = tasks
        self.groups = groups  # a submit's ``group``
        self.ops: dict[int, Handler] = {
            Op.TASK_SUBMIT: self.submit,
            Op.TASK_SUBMIT_MANY: self.submit_many,
            Op.MESSAGE_SEND: self.send,
        }
        self.appliers: dict[int, Applier] = {
            Rec.ITEM_ENQUEUED: self.apply_enqueued,
            Rec.DEDUPE_EXPIRED: self.apply_dedupe_expired,
            Rec.SNAP_ITEM: self.apply_snapshot_item,
            Rec.SNAP_QUEUED: self.apply_snapshot_queued,
            Rec.SNAP_DEDUPE: self.apply_snapshot_dedupe,
            **self.debounce.appliers,
        }

    # ---- submit and send -------------------------------------------------------------

    def submit(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant, scope_id, name, scope, _ = self.work.to_change(conn, args)
        key = opt_text(args, "key", _MAX_KEY_BYTES)
        slim = opt_bool(args, "slim", False)
        subscriber = opt_text(args, "subscriber_id", _MAX_SUBSCRIBER_ID_BYTES)
        deadline = args.get("deadline")
        if deadline is not None:
            deadline = check_number(deadline, "deadline", 0, 1e11)
        if "data" not in args:
            raise invalid("data is required (it may be nil)")
        if "debounce_key" in args or "debounce_seconds" in args:  # (no call when absent)
            refuse_debounce(args)
        data = args["data"]
        needs = None if args.get("needs") is None else self._needs(tenant, args)
        links = link_args(args)
        wall = self.tables.wall
        order = order_args(args, wall(now))
        digest, size = measured_payload(
            "data", data, salt=name + _salt(needs) + order.salt() + _links_salt(links)
        )
        group = None if args.get("group") is None else self.groups.group_arg(args, scope)
        trace = None if args.get("trace") is None else trace_arg(args)
        limits = self.work.keys.args(args)  # concurrency and rate keys (keylimits.py)
        existing = None if key is None or scope is None else scope.tasks.get(key)
        if existing is not None:
            self._join(now, existing, group, digest, subscriber, scope_id)
            return _answer(existing, False, slim)
        self.work.room_for_item(tenant, scope, size + (
            0 if subscriber is None else subscription_size(subscriber, scope_id)))
        self.work.room_for_key(tenant, name, order.fairness_key)
        self.work.keys.room(tenant, scope_id, name, limits)
        pools, quotas = _needs_fields(needs)
        parents, on_parent_failure, parent = _links_fields(links)
        rec = enqueued(
            item_id=self._task_id(tenant, scope_id, links), is_message=False,
            scope_id=scope_id, mailbox=name, key=key, digest=digest, data=data,
            created_wall=wall(now), deadline_wall=deadline, tenant=tenant, pools=pools,
            quotas=quotas, data_size=size, not_before=order.not_before,
            priority=order.priority, fairness_key=order.fairness_key, trace=trace,
            parents=parents, on_parent_failure=on_parent_failure, parent=parent,
        )
        self.tables.record(rec)  # ``commit``, its applier called natively (Tables.record)
        item = self.apply_enqueued(rec, now)
        assert item is not None
        self.work.keys.carry(now, item, limits)  # before anyone can receive it
        if group is not None:
            self.groups.join(now, item, group)
        if subscriber is not None:
            self.tasks.subscribe(now, item, subscriber, scope_id)
        if links is not None and links.ended:
            self.parents.decide(now, item)  # a parent already ended may decide it now
        if deadline is not None and deadline <= wall(now) and not item.terminal:
            self.endings.finish(
                now, item, Event.DEADLINE, None, "deadline passed before the task started"
            )
        self._dispatch(now, scope, name)
        return _answer(item, True, slim)

    def _join(self, now: float, existing: Item, group: Any, digest: bytes | None,
              subscriber: str | None, scope_id: str) -> None:
        """A submit whose key names ``existing``: the same input joins it (subscribing
        ``subscriber``), other input (or another mailbox, group) is refused."""
        self.groups.check_same(existing, group)
        if existing.digest != digest:
            raise CoreError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                f"task key {existing.key!r} in this scope already names a task with other "
                "input (or another mailbox); use a new key for new work",
                {"task": existing.id},
            )
        if subscriber is not None and subscriber not in existing.subscribers:
            self.tasks.subscribe(now, existing, subscriber, scope_id)

    def _task_id(self, tenant: str, scope_id: str, links: LinkArgs | None) -> str:
        """The new task's id; its links, if any, checked first (work/parents.py): its
        ITEM_ENQUEUED carries them."""
        if links is not None:
            self.parents.check(tenant, scope_id, links)
        return self.work.new_id("t", tenant)

    def submit_many(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Submit each of ``items`` as TASK_SUBMIT would, in order; one answer per item:
        ``{"id", "state", "created"}`` or ``{"error": {"code", "message", "details"}}``."""
        self.work.to_change(conn, args)  # the scope and mailbox are refused once, for all
        items = req_list(args, "items", Limits.MAX_SUBMIT_BATCH)
        results: list[dict[str, Any]] = []
        base = {"scope": args["scope"], "mailbox": args["mailbox"], "slim": True}
        for index, entry in enumerate(items):
            try:
                if not isinstance(entry, dict):
                    raise invalid(f"items[{index}] must be a map, got {type(entry).__name__}")
                if "scope" in entry or "mailbox" in entry or "slim" in entry:
                    raise invalid(
                        f"items[{index}] may not name its own scope, mailbox or slim: "
                        "they are the request's"
                    )
                results.append(self.submit(now, conn, rid, {**entry, **base}))
            except CoreError as exc:
                results.append(
                    {"error": {"code": exc.code.value, "message": exc.message,
                               "details": exc.details}}
                )
        return {"results": results}

    def send(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant, scope_id, name, scope, queue = self.work.to_change(conn, args)
        work_key = opt_text(args, "work_key", _MAX_KEY_BYTES)
        if "data" not in args:
            raise invalid("data is required (it may be nil)")
        data = args["data"]
        if "concurrency_key" in args or "rate_key" in args:  # (no call when absent)
            refuse_keys_on_send(args)
        debounce = (  # (no call when absent: the hot path)
            None if "debounce_key" not in args and "debounce_seconds" not in args
            else self.debounce.args(args)
        )
        needs = self._needs(tenant, args)
        refuse_links(args)  # (tasks only: work/parents.py)
        trace = None if args.get("trace") is None else trace_arg(args)
        wall = self.tables.wall
        order = order_args(args, wall(now))
        digest, size = measured_payload(
            "data", data, salt=None if work_key is None else _salt(needs) + order.salt()
        )
        if debounce is not None:  # held back for its window, or folded into the waiting one
            due = wall(now) + debounce[1]
            waiting = None if queue is None else queue.debounced.get(debounce[0])
            if waiting is not None:
                return self.debounce.replace(now, waiting, data, size, due, order)
            order = order._replace(not_before=due)
        if work_key is not None and queue is not None:
            seen = queue.dedupe.get(work_key)
            if seen is not None and seen[2] > wall(now):
                if seen[1] != digest:
                    raise CoreError(
                        ErrorCode.IDEMPOTENCY_CONFLICT,
                        f"work_key {work_key!r} was sent with other data within the dedupe "
                        "window",
                        {"id": seen[0]},
                    )
                return {"id": seen[0], "replay": True}
        self.work.room_for_item(
            tenant, scope, size if work_key is None else size + dedupe_size(work_key))
        self.work.room_for_key(tenant, name, order.fairness_key)
        pools, quotas = _needs_fields(needs)
        rec = enqueued(
            item_id=self.work.new_id("m", tenant), is_message=True, scope_id=scope_id,
            mailbox=name, key=work_key, digest=digest, data=data, created_wall=wall(now),
            deadline_wall=None, tenant=tenant, pools=pools, quotas=quotas, data_size=size,
            not_before=order.not_before, priority=order.priority,
            fairness_key=order.fairness_key, trace=trace,
        )
        self.tables.record(rec)  # ``commit``, its applier called natively (Tables.record)
        item = self.apply_enqueued(rec, now)
        assert item is not None
        if debounce is not None:
            self.debounce.hold(now, item, debounce[0])
            return {"id": item.id, "replay": False, "replaced": False}
        self._dispatch(now, scope, name)
        return {"id": item.id, "replay": False}

    def _needs(self, tenant: str, args: dict[str, Any]) -> Needs | None:
        return parse_needs(args, tenant, self.blocked.pools.pools, self.blocked.quotas.quotas,
                           self.tables.homes_run)

    def _dispatch(self, now: float, scope: Scope, name: str) -> None:
        """Hand what is ready in ``scope``'s queue ``name`` to parked consumers (the
        queue exists unless the new item has already ended and left it empty). ``scope``
        is the run the request found: a run leaves the table only between requests
        (runends.py), so it is still the table's."""
        queue = scope.queues.get(name)
        if queue is not None:
            self.deliveries.dispatch(now, queue)

    def apply_enqueued(self, rec: ItemEnqueued, now: float) -> Item | None:
        """ITEM_ENQUEUED; its needs (if any) are set before anyone can receive it."""
        (_, item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline,
         tenant, pools, quotas, size, not_before, priority, fairness_key, trace, parents,
         on_parent_failure, parent) = rec
        work = self.work
        space, number = item_number(item_id)
        if not work.item_ids.take(space, number):  # replayed again: it exists, or ended
            return work.items.get(item_id)
        scope = self.tables.scope_for(tenant, scope_id)
        queue = work.queue_of(scope, mailbox)
        # The queue's own strings: one copy per queue, not one per item.
        item = Item(
            queue.tenant, item_id, is_message, queue.scope, queue.mailbox, key, digest, data,
            created, deadline, not_before, priority, fairness_key,
        )
        item.size = size if size >= 0 else stored_size(data)
        item.trace = trace
        if pools is not None and quotas is not None:
            item.needs = Needs.from_record(pools, quotas)
        if is_message and key is not None:
            self._remember_work_key(item, created + work.dedupe_seconds)
        if parents is not None:  # a task with links: BLOCKED, maybe (work/parents.py)
            self.parents.adopt(item, parents, on_parent_failure, parent)
        self.place(item, now, queue, scope)
        return item

    # ---- placing an item -------------------------------------------------------------

    def place(
        self, item: Item, now: float, queue: Queue | None = None, scope: Scope | None = None
    ) -> None:
        """Put an item (new, or rebuilt from a snapshot) where its state says it is.
        Its scope is made only if the item lives in it (a task key, or unfinished).
        ``queue`` and ``scope``: its queue and run, when the caller has them at hand
        (saves finding them again)."""
        work = self.work
        work.add_item(item)
        if item.is_message and item.terminal:
            work.index_item(item)
            self.endings.schedule_ending(item)
            return
        if scope is None:
            scope = self.tables.scope_for(item.tenant, item.scope)
        if not item.is_message:
            if item.key is not None:
                scope.tasks[item.key] = item
            item.run = scope
            tally(item, None, item.state)
            if item.terminal:
                work.index_item(item, scope)
                self.endings.schedule_ending(item)
                return
        scope.live_items[item.id] = item
        work.index_item(item, scope)
        self.endings.watch_deadline(item)
        if item.state is State.PENDING:
            if item.awaiting_due:  # in a retry's backoff: until its ITEM_DUE
                self.deliveries.due_at(item)
            else:
                self.deliveries.ready_when_visible(item, now, queue)
        elif item.state is State.DELAYED:
            work.delay(item, queue)
            self.deliveries.due_at(item)
        elif item.state is State.WAITING:  # (from a snapshot: its signals follow)
            work.wait(item, queue)
            self.deliveries.due_at(item)  # its timeout
        elif item.state is State.BLOCKED:  # until its parents end (work/parents.py)
            work.block(item, queue)

    def apply_snapshot_item(self, rec: SnapItem, now: float) -> None:
        if rec[1] in self.work.items:
            return
        item, delivery = item_from_record(rec)
        item.size = stored_size(item.data) + stored_size(item.outcome)
        item.tenant = self.tables.tenants.name(item.tenant)
        if item.subscribers:
            self.tables.tenants.charge(item.tenant, subscriptions_size(item.subscribers))
        self.place(item, now)
        # Its scope's and queue's strings, as for an item enqueued live: one copy each.
        scope = self.tables.find_scope(item.tenant, item.scope)
        if scope is not None:
            item.scope = scope.id
            queue = scope.queues.get(item.mailbox)
            if queue is not None:
                item.mailbox = queue.mailbox
        if delivery is not None:
            self.deliveries.adopt(item, delivery, now)
            if item.needs is not None and item.delivery is not None:
                self.blocked.attach(item, item.delivery)  # its slots, as the delivery's

    def apply_snapshot_queued(self, rec: SnapQueued, now: float) -> None:
        """SNAP_QUEUED: each item it holds as its SNAP_ITEM (core/restore.py, the path
        recovery takes, places them in bulk into the same state)."""
        for item_rec in queued_items(rec):
            self.apply_snapshot_item(item_rec, now)

    # ---- work_key dedupe -------------------------------------------------------------

    def _remember_work_key(self, item: Item, until: float) -> None:
        queue = self.work.queue_of_item(item)
        assert item.key is not None and item.digest is not None
        self._keep_dedupe(queue, item.key)
        queue.dedupe[item.key] = (item.id, item.digest, until)
        self.tables.at_wall(until, self._dedupe_due, (queue, item.key, item.id))

    def _keep_dedupe(self, queue: Queue, key: str) -> None:
        """Charge ``queue``'s tenant for a dedupe entry of ``key`` about to be set (one
        that replaces an entry of the same key, past its window, costs nothing more)."""
        if key not in queue.dedupe:
            self.tables.tenants.charge(queue.tenant, dedupe_size(key))

    def _dedupe_due(self, now: float, arg: tuple[Queue, str, str]) -> None:
        queue, key, item_id = arg
        seen = queue.dedupe.get(key)
        if seen is None or seen[0] != item_id:
            return
        self.tables.commit(
            DedupeExpired(
                Rec.DEDUPE_EXPIRED, queue.scope, queue.mailbox, key, item_id, queue.tenant
            ),
            now,
        )

    def apply_dedupe_expired(self, rec: DedupeExpired, now: float) -> None:
        _, scope_id, mailbox, key, item_id, tenant = rec
        queue = self.work.find_queue(tenant, scope_id, mailbox)
        if queue is not None and queue.dedupe.get(key, ("",))[0] == item_id:
            del queue.dedupe[key]
            self.tables.tenants.charge(tenant, -dedupe_size(key))
            self.work.release(tenant, scope_id, mailbox)

    def apply_snapshot_dedupe(self, rec: SnapDedupe, now: float) -> None:
        _, scope_id, mailbox, key, item_id, digest, until, tenant = rec
        queue = self.work.queue_of(self.tables.scope_for(tenant, scope_id), mailbox)
        self._keep_dedupe(queue, key)
        queue.dedupe[key] = (item_id, digest, until)
        self.tables.at_wall(until, self._dedupe_due, (queue, key, item_id))


def _salt(needs: Needs | None) -> str:
    return "" if needs is None else needs.salt()


def _links_salt(links: LinkArgs | None) -> str:
    return "" if links is None else links.salt()


def _links_fields(links: LinkArgs | None) -> tuple[list[str] | None, str | None, str | None]:
    """ITEM_ENQUEUED's (parents, on_parent_failure, parent): a task's links, or all None
    for none (work/parents.py)."""
    return (None, None, None) if links is None else (
        links.parents, links.on_parent_failure, links.parent)


def _needs_fields(needs: Needs | None) -> tuple[list[str] | None, list[list[Any]] | None]:
    """ITEM_ENQUEUED's (pools, quotas): the item's needs, or (None, None) for none."""
    return (None, None) if needs is None else needs.as_record()


def _answer(item: Item, created: bool, slim: bool) -> dict[str, Any]:
    """TASK_SUBMIT's reply: the task view and ``created``; slim: only id, state, created
    (for callers that need only the id: a smaller reply to build, send and decode)."""
    if slim:
        return {"id": item.id, "state": item.state._value_, "created": created}
    view = item.view()  # a fresh dict: completed in place, not copied
    view["created"] = created
    return view
