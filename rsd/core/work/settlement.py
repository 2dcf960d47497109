"""Settlement: how a delivery ends (complete, retry, release, reject, lease expiry).

What always holds:
- a delivery settles once, and only with its live lease's whole handle, presented by a
  connection of its tenant: complete, retry, release or reject from anyone else (a
  worker whose lease expired, a second settlement of another kind, a guessed handle,
  another tenant) is STALE_CLAIM, and touches nothing;
- when a delivery's lease expires the item goes back on its queue, ready at once (at the
  end of the line), unless its attempts are used up: then it is FAILED and dead-lettered;
- retry waits out an exponential backoff with jitter (deterministic: derived from the
  item id and attempt, so the core stays reproducible); at the attempt limit: FAILED;
- release gives a delivery back without using an attempt;
- a repeat of a settlement already recorded (same handle, same kind, same tenant: its
  reply was lost in a disconnect or a restart) is answered as the first one was
  (``repeated``; settled.py keeps them for one lease length), never a second change;
- a delivery ended by its run's cancellation is refused with SCOPE_CANCELLED (not
  STALE_CLAIM) when its worker settles it within what would have been its lease: the
  handle is remembered that long (``cancelled``, in memory only; a timer forgets it), so
  the worker learns why; later, or after a restart, it is STALE_CLAIM like any other;
- a settlement may ask for the next deliveries of the same queue (``next``,
  ``settle_and_next``): one round trip for "done, give me more".
How an item ends (and is dead-lettered) is endings.py's; this module decides when. The
receive side (the ready line, parking, taking) and the end of a delivery's lease are
deliveries.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ..ground.batching import next_args
from ..ground.errors import CoreError
from ..ground.leases import Lease
from ..ground.payloads import measured_payload
from ..ground.validate import check_number, opt_text, req_handle
from ..records import Rec
from ..records.itemrecords import Requeued
from ..run.items import Event, Item, State, transition
from ..run.tally import tally
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .endings import Endings
from .settled import Settled
from .workbook import Work

__all__ = ["Settlement", "backoff_ms"]

# complete, retry or reject of the item a live delivery lease names: (now, item, args)
Settle = Callable[[float, Item, dict[str, Any]], dict[str, Any]]

# the reason a requeue or dead letter gives, by why the delivery's lease ended
_ENDED: Final = {"expired": "expired", "connection closed": "ended with its connection",
          "grant lapsed": "ended: its grant from another shard lapsed"}
_NOTED: Final = {"expired": "delivery lease expired",
          "connection closed": "delivery lease ended with its connection",
          "grant lapsed": "delivery ended: its grant from another shard lapsed"}
_SUCCEEDED: Final = State.SUCCEEDED.value  # (an enum member's ``.value`` is a property call)


def backoff_ms(item: Item, base_ms: int) -> int:
    """Exponential backoff with equal jitter, derived from (item, attempt)."""
    ceiling = min(Limits.MAX_RETRY_BACKOFF_MS, base_ms * 2 ** max(0, item.attempt - 1))
    seed = hashlib.blake2b(f"{item.id}:{item.attempt}".encode(), digest_size=4).digest()
    fraction = int.from_bytes(seed, "big") / 2**32
    return int(ceiling / 2 + fraction * ceiling / 2)


class Settlement:
    """DELIVERY_COMPLETE, DELIVERY_RETRY, DELIVERY_RELEASE, DELIVERY_REJECT, a delivery
    lease's expiry (``lease_expired`` for an item) and the REQUEUED record. Owned by the
    Core."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, endings: Endings,
        settled: Settled,
    ) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.endings = endings
        self.settled = settled  # recent settlements, to answer a repeat (settled.py)
        self.cancelled = deliveries.cancelled
        self.cancelling = deliveries.cancelling
        self.ops: dict[int, Handler] = {
            Op.DELIVERY_COMPLETE: self.settle_and_next(self.complete, Event.COMPLETE),
            Op.DELIVERY_RETRY: self.settle_and_next(self.retry, Event.RETRY),
            Op.DELIVERY_RELEASE: self.release,
            Op.DELIVERY_REJECT: self.settle_and_next(self.reject, Event.REJECT),
        }
        self.appliers: dict[int, Applier] = {
            Rec.REQUEUED: self.apply_requeued,
            Rec.SNAP_SETTLED: settled.apply_snapshot,
        }

    def settle_and_next(self, settle: Settle, kind: Event) -> Handler:
        """The handler of a settlement ``settle`` of the item under the request's live
        delivery lease (looked up once), which may also ask for the next deliveries of
        the same queue (``next``, batching.py): checked before anything changes, taken
        after the settlement (and the dispatch it caused) from what is ready while no
        receive is parked on the queue. A repeat of a settlement of ``kind`` already
        recorded is answered as the first (``repeated``)."""
        deliveries, settled_item, repeated = self.deliveries, self.settled_item, self.repeated
        find_queue, holders = self.work.find_queue, self.tables.holders
        shortest = self.tables.min_lease_seconds

        def handler(now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
            try:
                item = settled_item(conn, args)  # a stale lease is STALE_CLAIM first
            except CoreError as refusal:
                return repeated(now, conn, args, kind, refusal)
            value = args.get("next")
            if value is None:
                return settle(now, item, args)
            wanted = next_args(args, shortest, value)
            assert wanted is not None
            tenant, scope, mailbox, run = item.tenant, item.scope, item.mailbox, item.run
            reply = settle(now, item, args)
            # A task's run is the table's while the task is known (runends.py): its
            # queue is found there; a message's run is looked up.
            queue = (
                run.queues.get(mailbox) if run is not None
                else find_queue(tenant, scope, mailbox)
            )
            taken: list[dict[str, Any]] = []
            if queue is not None and not queue.consumers:  # parked receives go first
                holder = holders.get(conn, "")
                taken = deliveries.take(
                    now, conn, holder, wanted[0], queue, None, wanted[1], wanted[2]
                )
            reply["next"] = taken
            return reply

        return handler

    def settled_item(self, conn: int, args: dict[str, Any]) -> Item:
        """The item under the live delivery lease with this handle, of ``conn``'s tenant;
        STALE_CLAIM for anything else, with one message whatever the reason."""
        handle = req_handle(args)
        lease = self.tables.own_lease(conn, handle)
        if lease is None and self.cancelled:
            scope = self.cancelled.get(handle)
            if scope is not None and scope.tenant == self.tables.tenant_of(conn):
                raise CoreError(ErrorCode.SCOPE_CANCELLED, scope.cancelled_message())
        if lease is None or type(lease.owner) is not Item:
            raise CoreError(
                ErrorCode.STALE_CLAIM,
                f"delivery lease {handle.hex()} is not current: it expired, was settled or "
                "never existed",
            )
        item = lease.owner
        if self.cancelling and (item.tenant, item.scope) in self.cancelling:
            scope = self.tables.find_scope(item.tenant, item.scope)
            assert scope is not None
            raise CoreError(ErrorCode.SCOPE_CANCELLED, scope.cancelled_message())
        return item

    def repeated(
        self, now: float, conn: int, args: dict[str, Any], kind: Event, refusal: CoreError
    ) -> dict[str, Any]:
        """``settled_item`` refused a settlement of ``kind``: the reply of the first one if
        this is a repeat of a settlement recorded with the same handle (its reply was
        lost), else ``refusal`` is raised."""
        if refusal.code is ErrorCode.STALE_CLAIM:
            reply = self.settled.answer(
                now, self.tables.tenant_of(conn), args["lease"], kind.value, args
            )
            if reply is not None:
                return reply
        raise refusal

    # complete, retry and reject are given the item ``settled_item`` found (batching.py's
    # ``settle_and_next`` looks it up once, first, for the settlement and its ``next``).

    def complete(self, now: float, item: Item, args: dict[str, Any]) -> dict[str, Any]:
        outcome = args.get("outcome")
        size = measured_payload("outcome", outcome)[1]
        if not item.is_message:  # a message's outcome is not kept
            self.tables.tenants.room_for_bytes(item.tenant, size)
        self.endings.finish(
            now, item, Event.COMPLETE, outcome, None, settled_by=Event.COMPLETE,
            outcome_size=size,
        )
        return {"id": item.id, "state": _SUCCEEDED}

    def retry(self, now: float, item: Item, args: dict[str, Any]) -> dict[str, Any]:
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        delay_ms = args.get("delay_ms")
        if delay_ms is not None:
            delay_ms = int(check_number(delay_ms, "delay_ms", 0, Limits.MAX_RETRY_BACKOFF_MS))
        mailbox = self.work.mailbox_of(item)
        if item.attempt >= mailbox.max_attempts:
            self.endings.finish(
                now, item, Event.ATTEMPTS_EXHAUSTED, None,
                f"attempt limit of {mailbox.max_attempts} reached"
                + (f"; last error: {reason}" if reason else ""),
                dead=True, settled_by=Event.RETRY,
            )
            return {"id": item.id, "state": State.FAILED.value, "retry_in_ms": None}
        if delay_ms is None:
            delay_ms = backoff_ms(item, mailbox.retry_backoff_ms)
        self._requeue(now, item, Event.RETRY, delay_ms, reason)
        return {"id": item.id, "state": State.PENDING.value, "retry_in_ms": delay_ms}

    def release(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Give a delivery back untouched (a worker shutting down): no attempt used."""
        try:
            item = self.settled_item(conn, args)
        except CoreError as refusal:
            return self.repeated(now, conn, args, Event.RELEASE, refusal)
        self._requeue(now, item, Event.RELEASE, 0, None)
        return {"id": item.id, "state": State.PENDING.value}

    def reject(self, now: float, item: Item, args: dict[str, Any]) -> dict[str, Any]:
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        self.endings.finish(
            now, item, Event.REJECT, None, f"rejected: {reason}" if reason else "rejected",
            dead=True, settled_by=Event.REJECT,
        )
        return {"id": item.id, "state": State.FAILED.value}

    def expired(self, now: float, lease: Lease, reason: str = "expired") -> None:
        """A delivery's lease ran out, or (``reason`` "connection closed") the connection
        it was bound to closed, or ("grant lapsed") the grant of another shard's capacity
        it ran under lapsed (grants.py): the worker is presumed dead, or may no longer
        hold the capacity; take the item back, as at expiry (the attempt counts)."""
        item: Item = lease.owner
        self.tables.effects.lease_lost(lease, reason)
        mailbox = self.work.mailbox_of(item)
        last = item.attempt >= mailbox.max_attempts
        self.tables.effects.note(
            _NOTED[reason], scope=item.scope, mailbox=item.mailbox, item=item.id,
            lease=lease.id, holder=lease.holder, attempt=item.attempt,
            then="dead-lettered" if last else "requeued",
        )
        if last:
            self.endings.finish(
                now, item, Event.ATTEMPTS_EXHAUSTED, None,
                f"lease {_ENDED[reason]} on the last of {mailbox.max_attempts} attempts",
                dead=True,
            )
        else:
            self._requeue(now, item, Event.LEASE_EXPIRED, 0, f"lease {_ENDED[reason]}")

    def _requeue(
        self, now: float, item: Item, event: Event, delay_ms: int, reason: str | None
    ) -> None:
        visible_at = self.tables.wall(now) + delay_ms / 1000.0
        assert item.delivery is not None
        own = event is Event.RETRY or event is Event.RELEASE  # its own settlement: when
        self.tables.commit(Requeued(
            Rec.REQUEUED, item.id, item.delivery.handle, event.value, visible_at, reason,
            self.tables.wall(now) if own else None,
        ), now)
        queue = self.work.find_queue(item.tenant, item.scope, item.mailbox)
        if queue is not None:
            self.deliveries.dispatch(now, queue)

    def apply_requeued(self, rec: Requeued, now: float) -> None:
        # settled_at: its own settlement (retry, release), remembered below
        _, item_id, handle, event_name, visible_at, reason, settled_at = rec
        item = self.work.items.get(item_id)
        if item is None or item.delivery is None or item.delivery.handle != handle:
            return  # replayed again: that delivery is already over
        event = Event(event_name)
        if event is Event.RELEASE:  # (before its state: the event's attempt is the count)
            item.attempt -= 1
        old = item.state
        self.work.set_state(item, transition(old, event))
        tally(item, old, item.state)
        if reason is not None:
            item.reason = reason
        lease = self.deliveries.end_delivery(item)
        if lease is not None and settled_at is not None:
            self.settled.remember(
                now, item.tenant, handle, event.value, item_id, item.state.value,
                visible_at if event is Event.RETRY else None, settled_at + lease.length,
            )
        item.visible_at = visible_at
        if event is Event.RETRY and settled_at is not None and visible_at > settled_at:
            item.awaiting_due = True  # a backoff: ITEM_DUE ends it (deliveries.py)
            self.deliveries.due_at(item)
        else:
            self.deliveries.ready_when_visible(item, now)
        self.work.release(item.tenant, item.scope, item.mailbox)  # empty during a backoff
