"""Deliveries: the ready line, and handing items to workers under leases.

What always holds:
- an item is delivered to one worker at a time under a lease (its fencing token); the
  delivery's ``attempt`` counts deliveries, the first being 1;
- idle consumers do not poll: a receive with ``wait`` parks, and the next item that
  becomes ready is delivered to the longest-waiting consumer in the same call;
- an item with ``needs`` is handed out only with all its capacity, which its delivery's
  lease holds until the delivery ends (blocked.py decides, and keeps those that wait).
- a batched receive (``max``) and a settlement's ``next`` take from the ready line by
  the same rule (``take``); a ``next`` never jumps ahead of a parked receive: it takes
  only what is ready while nobody is parked on the queue (batching.py has the shapes).
- a delivery's end gives back its lease and the capacity it held (``end_delivery``),
  whoever ends it (its settlement, its item's ending, its run's cancellation);
- a delivery ended by its run's cancellation is remembered (``cancelled``, in memory
  only; a timer forgets it) until its lease would have run out, so that its worker's
  settlement is told SCOPE_CANCELLED rather than STALE_CLAIM.
When and how a delivery is settled (complete, retry, release, reject, expiry) is
settlement.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ..ground.batching import batch_reply, receive_max
from ..ground.effects import DEFERRED
from ..ground.leases import NO_CONN, Lease, lease_id_of
from ..ground.timerwheel import Timer
from ..ground.validate import lease_seconds, opt_bool, opt_number
from ..ground.waits import Wait
from ..records import Rec
from ..records.itemrecords import Delivered, ItemDue, WaitTimedOut, built
from ..run.items import Event, Item, State, transition
from ..run.links import parents_view
from ..run.queue import Queue
from ..run.scope import Scope
from ..run.tally import tally
from ..state.tables import Applier, Handler, Tables
from .blocked import Blocked
from .workbook import Work

__all__ = ["Deliveries", "ReceiveWait"]

_MAX_RECEIVE_BATCH_BYTES: Final = Limits.MAX_RECEIVE_BATCH_BYTES
_DEFAULT_WAIT_TIMEOUT_MS: Final = Limits.DEFAULT_WAIT_TIMEOUT_MS


class ReceiveWait(Wait):
    """A receive parked until an item is ready in its queue."""

    __slots__ = ("bound", "holder", "length", "many", "queue", "work")

    def __init__(
        self, work: Work, queue: Queue, conn: int, rid: int, holder: str, length: float,
        deadline: float, since: float, many: int | None, bound: bool = False,
    ) -> None:
        super().__init__(conn, rid, deadline, since)
        self.work = work
        self.queue = queue
        self.holder = holder
        self.length = length
        self.many = many  # RECEIVE's max: None for the single-delivery reply
        self.bound = bound  # release_on_disconnect: its deliveries end with its connection

    def withdraw(self) -> None:
        """Leave the line; a queue (and run) that only this consumer kept is freed."""
        queue = self.queue
        queue.consumers.withdraw(self)
        self.work.release(queue.tenant, queue.scope, queue.mailbox)

    def fire(self, now: float) -> None:
        # An idle consumer's wait running out is not an error: it gets "nothing yet".
        if not self.pending or self.registry is None:
            return
        if self.deadline > now:
            self.registry.wheel.schedule(self.deadline, self)
            return
        self.registry.served(self)
        self.withdraw()
        self.registry.effects.reply(self.conn, self.request_id, batch_reply(self.many, []))


class Deliveries:
    """RECEIVE, the ready line, and each delivery's start and end. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, blocked: Blocked) -> None:
        self.tables = tables
        self.work = work
        self.blocked = blocked  # items that need capacity (blocked.py)
        # handles of deliveries their run's cancellation ended -> that run, for at most
        # one lease length each (remember_cancelled)
        self.cancelled: dict[bytes, Scope] = {}
        # (tenant, run id) of runs whose cancellation is still being worked through
        # (cascade.py): their deliveries still live are settled by nobody but the cascade.
        self.cancelling: set[tuple[str, str]] = set()
        self.ops: dict[int, Handler] = {Op.RECEIVE: self.receive}
        self.appliers: dict[int, Applier] = {
            Rec.DELIVERED: self.apply_delivered, Rec.ITEM_DUE: self.apply_due,
        }

    # ---- receive ---------------------------------------------------------------------

    def receive(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Take the first ready item (up to ``max`` of them), or park (``wait``) until
        one is ready. A receive that finds nothing and does not park leaves no trace; one
        that parks keeps its queue (and run) only while it waits."""
        _, _, name, scope, queue = self.work.to_change(conn, args)
        length = lease_seconds(args, self.tables.min_lease_seconds)
        many = receive_max(args)
        wait = opt_bool(args, "wait", False)
        bound = opt_bool(args, "release_on_disconnect", False)
        timeout_ms = opt_number(
            args, "timeout_ms", _DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        holder = self.tables.holders.get(conn, "")
        item = self.blocked.pop(now, queue) if queue is not None else None
        if item is not None:
            assert queue is not None
            if many is None:
                return {"delivery": self._deliver(now, conn, holder, length, item, bound)}
            return {
                "deliveries": self.take(now, conn, holder, length, queue, item, many, bound)
            }
        if not wait or timeout_ms == 0:
            return batch_reply(many, [])
        if queue is None:
            queue = self.work.queue_of(scope, name)
        consumer = ReceiveWait(
            self.work, queue, conn, rid, holder, length, now + timeout_ms / 1000.0, now, many,
            bound,
        )
        queue.consumers.append(consumer)
        self.tables.waits.add(consumer)
        if queue.held:
            queue.depth.parked[queue] = None  # served at its resume (pauses.py)
        return DEFERRED

    def dispatch(self, now: float, queue: Queue) -> None:
        """Hand ready items to parked consumers, longest-waiting first, each up to its
        ``max`` (one without it); a paused queue's wait for its resume (pauses.py)."""
        if queue.held:
            if queue.consumers:
                queue.depth.parked[queue] = None
            return
        while queue.consumers:
            item = self.blocked.pop(now, queue)
            if item is None:
                return
            self.serve(now, queue, item)

    def serve(self, now: float, queue: Queue, item: Item) -> None:
        """Deliver ``item`` (off its line, able to start) to the longest-parked consumer,
        with up to its ``max`` - 1 more ready items (only ``item`` without ``max``)."""
        consumer = queue.consumers.popleft()
        assert isinstance(consumer, ReceiveWait)
        self.tables.waits.served(consumer)
        conn, waited = consumer.conn, now - consumer.since
        if consumer.many is None:
            reply: dict[str, Any] = {"delivery": self._deliver(
                now, conn, consumer.holder, consumer.length, item, consumer.bound, waited
            )}
        else:
            reply = {"deliveries": self.take(
                now, conn, consumer.holder, consumer.length, queue, item, consumer.many,
                consumer.bound, waited,
            )}
        self.tables.effects.reply(conn, consumer.request_id, reply)

    def take(
        self, now: float, conn: int, holder: str, length: float, queue: Queue,
        first: Item | None, many: int, bound: bool, waited: float = 0.0,
    ) -> list[dict[str, Any]]:
        """Deliver ``first`` (already off the ready line) and up to ``many`` - 1 more
        ready items, stopping before their data passes MAX_RECEIVE_BATCH_BYTES
        (``bound``: each until ``conn`` closes at the latest)."""
        taken: list[dict[str, Any]] = []
        budget = _MAX_RECEIVE_BATCH_BYTES
        item = first if first is not None else self.blocked.pop(now, queue)
        while item is not None:
            if many > 1:
                # A ready item's size is its data's encoded size, measured on the way in
                # (0 for nil, which encodes in 1 byte): no second encoding.
                budget -= item.size or 1
                if budget < 0 and taken:
                    queue.unpop(item)
                    break
            taken.append(self._deliver(now, conn, holder, length, item, bound, waited))
            if len(taken) >= many:
                break
            item = self.blocked.pop(now, queue)
        return taken

    def _deliver(
        self, now: float, conn: int, holder: str, length: float, item: Item, bound: bool,
        waited: float = 0.0,
    ) -> dict[str, Any]:
        tables = self.tables
        if item.limits is not None:  # a rate key's new period begins (keylimits.py)
            self.work.keys.begin_period(now, item)
        rec = built(Delivered, (
            Rec.DELIVERED, item.id, tables.new_lease_handle(item.tenant), item.attempt + 1,
            holder, length, bound,
        ))
        tables.record(rec)  # ``commit``, its applier called natively (Tables.record)
        lease = self.apply_delivered(rec, now)
        assert lease is not None
        lease.conn = conn
        if bound:
            tables.leases.bind(lease, conn)
        if item.needs is not None:
            self.blocked.spend(now, item)
        delivery = {
            "lease": lease.handle,
            "id": item.id,
            "kind": "message" if item.is_message else "task",
            "task_id": None if item.is_message else item.id,
            "key": item.key,
            "data": item.data,
            "attempt": item.attempt,
            "lease_seconds": length,
            "waited_ms": int(waited * 1000),
        }
        signals = item.signals
        if signals is not None and signals.woken is not None:  # it woke the last wait
            delivery["signal"] = signals.carried()
        if item.trace is not None:  # its submitter's trace context (ground/traces.py)
            delivery["trace"] = item.trace
        links = item.links
        if links is not None and links.parents:  # the outcomes it waited for (parents.py)
            delivery["parents"] = parents_view(links, self.work.items)
        return delivery

    def apply_delivered(self, rec: Delivered, now: float) -> Lease | None:
        _, item_id, handle, attempt, holder, length, bound = rec
        item = self.work.items.get(item_id)
        leases = self.tables.leases
        if item is None or leases.ids.seen(item.tenant, lease_id_of(handle)):
            return None  # replayed again: that delivery has already begun (and maybe ended)
        queue = self.work.queue_of_item(item)
        if item.queued:  # replay: the live delivery had taken it off the ready line
            queue.take(item)
        if item.debounce_key is not None:  # delivered: its key starts anew (debounce.py)
            queue.let_go(item)
        old = item.state
        item.attempt = attempt  # (before its state: a RUNNING event says its attempt)
        self.work.set_state(item, transition(old, Event.DELIVER))
        tally(item, old, item.state)
        item.queued = False
        lease = leases.add(handle, item, holder, NO_CONN, length, now)
        if bound:
            leases.bind(lease, NO_CONN)  # to its connection: by ``_deliver``, live
        item.delivery = lease
        if item.needs is not None:  # (the check ``attach`` makes, without the call)
            self.blocked.attach(item, lease)
        if item.limits is not None:  # running, and in its rate period (keylimits.py)
            self.work.keys.started(item)
        queue.start_running()
        return lease

    def adopt(self, item: Item, delivery: Sequence[Any], now: float) -> None:
        """Give an item rebuilt from a snapshot back its running delivery (lease handle,
        holder, lease seconds, whether it ends with its connection)."""
        handle, holder, length, bound = delivery
        leases = self.tables.leases
        lease = item.delivery = leases.add(handle, item, holder, NO_CONN, length, now)
        if bound:
            leases.bind(lease, NO_CONN)
        self.work.queue_of_item(item).start_running()

    # ---- the ready line --------------------------------------------------------------

    def ready_when_visible(self, item: Item, now: float, queue: Queue | None = None) -> None:
        """A pending item joins its ready line now, or when its backoff has passed
        (``queue``: its queue, when the caller has it at hand)."""
        if item.visible_at <= self.tables.wall(now):
            self._make_ready(item, queue)
        else:
            self.tables.at_wall(item.visible_at, self.visible_due, item.id)

    def _make_ready(self, item: Item, queue: Queue | None = None) -> None:
        if item.state is State.PENDING and not item.queued:
            if queue is None:
                queue = self.work.queue_of_item(item)
            queue.push(item)

    def due_at(self, item: Item) -> None:
        """A DELAYED item (placed) gets its timer: ITEM_DUE at its ``visible_at``, its
        not_before. The same timer as a backoff's (``visible_due``), which an ending
        takes back."""
        self.tables.at_wall(item.visible_at, self.visible_due, item.id)

    def visible_due(self, now: float, item_id: str) -> None:
        """A backoff or a delay ran out: the item is ready (a DELAYED one by its ITEM_DUE
        record) and handed to a parked consumer, if one waits."""
        # Timers hold ids, not items: an item that ended is not kept alive by its timers.
        item = self.work.items.get(item_id)
        if item is None or item.queued:
            return
        state = item.state
        if state is not State.PENDING and state is not State.DELAYED:
            if state is State.WAITING:
                self._wait_due(now, item)
            return
        if self.tables.after(item.visible_at, now):
            self.tables.at_wall(item.visible_at, self.visible_due, item_id)
            return
        if state is State.DELAYED or item.awaiting_due:
            self.tables.commit(ItemDue(Rec.ITEM_DUE, item_id), now)
        else:
            self._make_ready(item)
        self.dispatch(now, self.work.queue_of_item(item))

    def _wait_due(self, now: float, item: Item) -> None:
        """A WAITING task's timeout (its ``visible_at``) came before a signal: it is
        ready, with no signal (WAIT_TIMED_OUT, applied by work/waiting.py)."""
        if self.tables.after(item.visible_at, now):
            self.tables.at_wall(item.visible_at, self.visible_due, item.id)
            return
        self.tables.commit(WaitTimedOut(Rec.WAIT_TIMED_OUT, item.id, item.signals.waits), now)
        self.dispatch(now, self.work.queue_of_item(item))

    def apply_due(self, rec: ItemDue, now: float) -> None:
        """ITEM_DUE: a DELAYED item becomes PENDING, at the end of its ready line; a
        PENDING one whose retry backoff ran out joins the end of its ready line."""
        item = self.work.items.get(rec[1])
        if item is not None and item.awaiting_due and item.state is State.PENDING:
            item.awaiting_due = False
            self._make_ready(item)
            return
        if item is None or item.state is not State.DELAYED:
            return  # replayed again, or it ended meanwhile
        old = item.state
        self.work.set_state(item, transition(old, Event.DUE))
        tally(item, old, item.state)
        self._make_ready(item)

    def offer(self, now: float, item: Item) -> None:
        """``item_unblocked``: an item that waited for capacity can start now: to its
        queue's longest-parked consumer, else back at the end of its ready line."""
        queue = self.work.queue_of_item(item)
        if queue.consumers and not queue.held:
            self.serve(now, queue, item)
        else:
            queue.push(item)

    def run_cancelled(self, now: float, scope: Scope) -> None:
        """``run_cancelled``: the run's parked consumers are refused."""
        for queue in list(scope.queues.values()):  # a queue left empty is freed
            for consumer in list(queue.consumers):
                self.tables.waits.end(
                    consumer, ErrorCode.SCOPE_CANCELLED, scope.cancelled_message()
                )

    # ---- a delivery's end ------------------------------------------------------------

    def end_delivery(self, item: Item, queue: Queue | None = None) -> Lease | None:
        """End ``item``'s delivery, if it has one (``queue``: its queue, when the caller
        has it at hand); its lease, or None."""
        lease = item.delivery
        if lease is not None:
            item.delivery = None
            self.tables.leases.end(lease)
            if item.needs is not None:  # (the check ``detach`` makes, without the call)
                self.blocked.detach(item, lease)
            if item.limits is not None:  # its concurrency slot is free (keylimits.py)
                self.work.keys.stopped(item)
            if queue is None:
                queue = self.work.queue_of_item(item)
            queue.stop_running()
        return lease

    def remember_cancelled(self, lease: Lease, scope: Scope) -> None:
        """``lease``'s delivery ends because ``scope`` was cancelled: until the lease
        would have expired, a settlement with it is SCOPE_CANCELLED. O(1)."""
        self.cancelled[lease.handle] = scope
        self.tables.wheel.schedule(lease.expires_at, Timer(self._forget_cancelled, lease.handle))

    def _forget_cancelled(self, now: float, handle: bytes) -> None:
        self.cancelled.pop(handle, None)
