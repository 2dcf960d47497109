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
- a delivery's end gives back its lease and the capacity it held (``end_delivery``).
How an item ends (and is dead-lettered) is tasks.py's; this module decides when. The
receive side (the ready line, parking, taking) is deliveries.py's ``Deliveries``, which
is a ``Settlement``: one object owns both ends of a delivery.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits, Push

from .errors import CoreError
from .items import Event, Item, State, transition
from .leases import Lease
from .payloads import measured_payload
from .queue import Queue
from .records import Rec
from .scopes import Scope
from .settled import Settled
from .tables import Tables
from .tally import tally
from .timerwheel import Timer
from .validate import check_number, opt_text, req_handle
from .work import Work

if TYPE_CHECKING:
    from .blocked import Blocked
    from .tasks import Tasks

__all__ = ["Settlement", "backoff_ms"]

_SUCCEEDED = State.SUCCEEDED.value  # (an enum member's ``.value`` is a property call)


def backoff_ms(item: Item, base_ms: int) -> int:
    """Exponential backoff with equal jitter, derived from (item, attempt)."""
    ceiling = min(Limits.MAX_RETRY_BACKOFF_MS, base_ms * 2 ** max(0, item.attempt - 1))
    seed = hashlib.blake2b(f"{item.id}:{item.attempt}".encode(), digest_size=4).digest()
    fraction = int.from_bytes(seed, "big") / 2**32
    return int(ceiling / 2 + fraction * ceiling / 2)


class Settlement(ABC):
    """The settling half of the delivery book (``Deliveries`` is its receiving half)."""

    tables: Tables
    work: Work
    tasks: Tasks  # wired by the Core: settlement ends tasks through it
    blocked: Blocked  # wired by the Core: the capacity a delivery holds
    # handles of deliveries their run's cancellation ended -> that run, for at most one
    # lease length each (remember_cancelled)
    cancelled: dict[bytes, Scope]
    cancelling: set[tuple[str, str]]  # runs whose cancellation is being worked through
    settled: Settled  # recent settlements, to answer a repeat (settled.py)

    @abstractmethod
    def dispatch(self, now: float, queue: Queue) -> None:
        """Hand ready items to the queue's parked consumers (the receiving half)."""

    @abstractmethod
    def ready_when_visible(self, item: Item, now: float, queue: Queue | None = None) -> None:
        """Put a pending item on its ready line, now or after its backoff."""

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
        self.work.measured = size
        self.tasks.finish(now, item, Event.COMPLETE, outcome, None, settled_by=Event.COMPLETE)
        return {"id": item.id, "state": _SUCCEEDED}

    def retry(self, now: float, item: Item, args: dict[str, Any]) -> dict[str, Any]:
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        delay_ms = args.get("delay_ms")
        if delay_ms is not None:
            delay_ms = int(check_number(delay_ms, "delay_ms", 0, Limits.MAX_RETRY_BACKOFF_MS))
        mailbox = self.work.mailbox_of(item)
        if item.attempt >= mailbox.max_attempts:
            self.tasks.finish(
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
        self.tasks.finish(
            now, item, Event.REJECT, None, f"rejected: {reason}" if reason else "rejected",
            dead=True, settled_by=Event.REJECT,
        )
        return {"id": item.id, "state": State.FAILED.value}

    def expired(self, now: float, lease: Lease) -> None:
        """A delivery's lease ran out: the worker is presumed dead; take the item back."""
        item: Item = lease.owner
        self.tables.effects.push(
            lease.conn, Push.LEASE_LOST, {"lease": lease.handle, "reason": "expired"}
        )
        mailbox = self.work.mailbox_of(item)
        last = item.attempt >= mailbox.max_attempts
        self.tables.effects.note(
            "delivery lease expired", scope=item.scope, mailbox=item.mailbox, item=item.id,
            lease=lease.id, holder=lease.holder, attempt=item.attempt,
            then="dead-lettered" if last else "requeued",
        )
        if last:
            self.tasks.finish(
                now, item, Event.ATTEMPTS_EXHAUSTED, None,
                f"lease expired on the last of {mailbox.max_attempts} attempts", dead=True,
            )
        else:
            self._requeue(now, item, Event.LEASE_EXPIRED, 0, "lease expired")

    def _requeue(
        self, now: float, item: Item, event: Event, delay_ms: int, reason: str | None
    ) -> None:
        visible_at = self.tables.wall(now) + delay_ms / 1000.0
        assert item.delivery is not None
        rec: tuple[Any, ...] = (
            Rec.REQUEUED, item.id, item.delivery.handle, event.value, visible_at, reason
        )
        if event is Event.RETRY or event is Event.RELEASE:  # its own settlement: when
            rec += (self.tables.wall(now),)
        self.tables.commit(rec, now)
        queue = self.work.find_queue(item.tenant, item.scope, item.mailbox)
        if queue is not None:
            self.dispatch(now, queue)

    def apply_requeued(self, rec: tuple[Any, ...], now: float) -> None:
        if len(rec) == 6:
            _, item_id, handle, event, visible_at, reason = rec
            settled_at = None
        else:  # its own settlement (retry, release): remembered below
            _, item_id, handle, event, visible_at, reason, settled_at = rec
        item = self.work.items.get(item_id)
        if item is None or item.delivery is None or item.delivery.handle != handle:
            return  # replayed again: that delivery is already over
        event = Event(event)
        old = item.state
        self.work.set_state(item, transition(old, event))
        tally(item, old, item.state)
        if event is Event.RELEASE:
            item.attempt -= 1
        if reason is not None:
            item.reason = reason
        lease = self.end_delivery(item)
        if lease is not None and settled_at is not None:
            self.settled.remember(
                now, item.tenant, handle, event.value, item_id, item.state.value,
                visible_at if event is Event.RETRY else None, settled_at + lease.length,
            )
        item.visible_at = visible_at
        self.ready_when_visible(item, now)
        self.work.release(item.tenant, item.scope, item.mailbox)  # empty during a backoff

    def end_delivery(self, item: Item, queue: Queue | None = None) -> Lease | None:
        """End ``item``'s delivery, if it has one (``queue``: its queue, when the caller
        has it at hand); its lease, or None."""
        lease = item.delivery
        if lease is not None:
            item.delivery = None
            self.tables.leases.end(lease)
            if item.needs is not None:  # (the check ``detach`` makes, without the call)
                self.blocked.detach(item, lease)
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
