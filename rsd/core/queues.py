"""Work queues: shared tasks and plain messages, leased deliveries, crash takeover.

What always holds:
- a task is one per (scope, key): the same key with the same input (canonical digest)
  returns the existing task whatever its state; other input is IDEMPOTENCY_CONFLICT;
- an item is delivered to one worker at a time under a lease (its fencing token); the
  delivery's ``attempt`` counts deliveries, the first being 1;
- a delivery settles once, and only with its live lease: complete, retry, release or
  reject from anyone else (a worker whose lease expired, a second call) is STALE_CLAIM;
- when a delivery's lease expires the item goes back on its queue, ready at once (at the
  end of the line), unless its attempts are used up: then it is FAILED and dead-lettered;
- retry waits out an exponential backoff with jitter (deterministic: derived from the
  item id and attempt, so the core stays reproducible); at the attempt limit: FAILED;
- a terminal task pushes its result to every pending ``result`` wait at once, keeps its
  outcome for the retention window, then is tombstoned (state and reason kept);
- idle consumers do not poll: a receive with ``wait`` parks, and the next item that
  becomes ready is delivered to the longest-waiting consumer in the same call;
- a message is a task without a result; its work_key dedupes sends for the window.
Deadlines, retention and dedupe windows are wall-clock instants (``now + wall_offset``)
so that they mean the same after a restart.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from rsproto import ErrorCode, Limits, Push

from .effects import DEFERRED, Effects
from .errors import CoreError
from .leases import Lease, LeaseTable
from .mailboxes import MODES, Mailbox
from .records import Rec
from .scopes import Scope
from .tasks import (
    STATE_BY_NAME,
    Item,
    State,
    canonical_digest,
    nested_deeper_than,
    transition,
)
from .timerwheel import Timer, TimerWheel
from .validate import (
    check_number,
    invalid,
    lease_seconds,
    opt_bool,
    opt_number,
    opt_text,
    req_id,
    req_text,
)
from .waits import Wait, Waits

__all__ = ["Queue", "WorkBook"]



class Queue:
    """One mailbox inside one scope."""

    __slots__ = (
        "consumers", "dead_ids", "dead_letters", "dedupe", "mailbox", "ready", "running",
        "scope", "stale",
    )

    def __init__(self, scope: str, mailbox: str) -> None:
        self.scope = scope
        self.mailbox = mailbox
        self.ready: deque[Item] = deque()  # may hold items no longer queued: skipped
        self.stale = 0  # how many entries of ``ready`` are such leftovers
        self.consumers: deque[ReceiveWait] = deque()
        self.dedupe: dict[str, tuple[str, bytes, float]] = {}  # work_key -> id, digest, until
        self.dead_letters: deque[dict[str, Any]] = deque()
        self.dead_ids: set[str] = set()  # the ids in ``dead_letters``
        self.running = 0

    def add_dead_letter(self, entry: dict[str, Any]) -> None:
        """Keep the newest MAX_DEAD_LETTERS; an entry already present is not added twice."""
        if entry["id"] in self.dead_ids:
            return
        self.dead_letters.append(entry)
        self.dead_ids.add(entry["id"])
        while len(self.dead_letters) > Limits.MAX_DEAD_LETTERS:
            self.dead_ids.discard(self.dead_letters.popleft()["id"])


class ReceiveWait(Wait):
    """A receive parked until an item is ready in its queue."""

    __slots__ = ("holder", "length", "queue")

    def __init__(
        self, queue: Queue, conn: int, rid: int, holder: str, length: float, deadline: float,
        since: float,
    ) -> None:
        super().__init__(conn, rid, deadline, since)
        self.queue = queue
        self.holder = holder
        self.length = length

    def withdraw(self) -> None:
        self.queue.consumers.remove(self)

    def fire(self, now: float) -> None:
        # An idle consumer's wait running out is not an error: it gets "nothing yet".
        if not self.pending or self.registry is None:
            return
        if self.deadline > now:
            self.registry.wheel.schedule(self.deadline, self)
            return
        self.queue.consumers.remove(self)
        self.registry.served(self)
        self.registry.effects.reply(self.conn, self.request_id, {"delivery": None})


class ResultWait(Wait):
    """A ``result`` call parked until its task ends."""

    __slots__ = ("item",)

    def __init__(self, item: Item, conn: int, rid: int, deadline: float, since: float) -> None:
        super().__init__(conn, rid, deadline, since)
        self.item = item

    def withdraw(self) -> None:
        self.item.watchers.remove(self)  # type: ignore[union-attr]

    def timeout_message(self) -> str:
        return f"task {self.item.id} had not finished when the wait timed out"


def _backoff_ms(item: Item, base_ms: int) -> int:
    """Exponential backoff with equal jitter, derived from (item, attempt)."""
    ceiling = min(Limits.MAX_RETRY_BACKOFF_MS, base_ms * 2 ** max(0, item.attempt - 1))
    seed = hashlib.blake2b(f"{item.id}:{item.attempt}".encode(), digest_size=4).digest()
    fraction = int.from_bytes(seed, "big") / 2**32
    return int(ceiling / 2 + fraction * ceiling / 2)


def _payload_size(value: Any) -> int:
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise invalid(f"payload cannot be encoded: {exc}") from None


def checked_payload(name: str, value: Any, salt: str | None = None) -> bytes | None:
    """The one check of a client payload (data, outcome): nesting depth, encodability and
    size, each refused with INVALID_ARGUMENT naming the limit. With ``salt``, returns the
    payload's canonical digest (for idempotency), computed in the same pass."""
    if nested_deeper_than(value, Limits.MAX_PAYLOAD_DEPTH):
        raise invalid(
            f"{name} nests maps and arrays more than {Limits.MAX_PAYLOAD_DEPTH} levels deep"
        )
    digest = None
    if salt is None:
        size = _payload_size(value)
    else:
        try:
            digest, size = canonical_digest(value, salt)
        except (TypeError, ValueError, OverflowError) as exc:
            raise invalid(f"{name} cannot be encoded: {exc}") from None
    if size > Limits.MAX_PAYLOAD_BYTES:
        raise invalid(
            f"{name} is {size} bytes encoded; the limit is {Limits.MAX_PAYLOAD_BYTES} bytes"
        )
    return digest


class WorkBook:
    """Mailboxes, queues, tasks, messages and deliveries. Owned by the Core."""

    def __init__(
        self,
        leases: LeaseTable,
        wheel: TimerWheel,
        waits: Waits,
        effects: Effects,
        scope_for: Callable[[str], Scope],
        find_scope: Callable[[str], Scope | None],
        wall: Callable[[float], float],
        retention_seconds: float,
        dedupe_seconds: float,
        tombstone_seconds: float,
    ) -> None:
        self.leases = leases
        self.wheel = wheel
        self.waits = waits
        self.effects = effects
        self.scope_for = scope_for  # makes the scope on first use: for changes
        self.find_scope = find_scope  # only looks: for reads
        self.wall = wall  # monotonic now -> wall clock
        self.retention_seconds = retention_seconds
        self.dedupe_seconds = dedupe_seconds
        self.tombstone_seconds = tombstone_seconds
        self.mailboxes: dict[str, Mailbox] = {}
        self.items: dict[str, Item] = {}
        self.next_item = 1
        self._queue_scopes: set[str] = set()  # scopes that have (had) a queue

    # ---- mailboxes -------------------------------------------------------------------

    def ensure(self, args: dict[str, Any]) -> dict[str, Any]:
        name = req_text(args, "name", Limits.MAX_MAILBOX_NAME_BYTES)
        mode = args.get("mode")
        if mode is None:
            mode = "WORK"
        if mode not in MODES:
            raise invalid(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        max_attempts = opt_number(
            args, "max_attempts", Limits.DEFAULT_MAX_ATTEMPTS, 1, Limits.MAX_ATTEMPTS
        )
        if type(max_attempts) is not int:
            raise invalid(f"max_attempts must be an integer, got {max_attempts!r}")
        backoff = opt_number(
            args, "retry_backoff_ms", Limits.DEFAULT_RETRY_BACKOFF_MS, 0,
            Limits.MAX_RETRY_BACKOFF_MS,
        )
        if type(backoff) is not int:
            raise invalid(f"retry_backoff_ms must be an integer, got {backoff!r}")
        existing = self.mailboxes.get(name)
        created = existing is None
        if created or (existing.mode, existing.max_attempts, existing.retry_backoff_ms) != (
            mode, max_attempts, backoff
        ):
            rec = (Rec.MAILBOX_ENSURED, name, mode, max_attempts, backoff)
            self.effects.records.append(rec)
            self.apply_mailbox(rec)
        return {**self.mailboxes[name].view(), "created": created}

    def apply_mailbox(self, rec: tuple[Any, ...]) -> None:
        _, name, mode, max_attempts, backoff = rec
        self.mailboxes[name] = Mailbox(name, mode, max_attempts, backoff)

    def _queue_address(self, args: dict[str, Any]) -> tuple[str, str]:
        """The (scope id, mailbox) a request names; NOT_FOUND for a mailbox never ensured."""
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        if name not in self.mailboxes:
            raise CoreError(
                ErrorCode.NOT_FOUND,
                f"mailbox {name!r} does not exist; create it with mailboxes.ensure first",
            )
        return scope_id, name

    def _queue(self, args: dict[str, Any]) -> tuple[Scope, Queue]:
        """For changes: the queue, made on first use; refused in a cancelled run."""
        scope_id, name = self._queue_address(args)
        scope = self.scope_for(scope_id)
        scope.refuse_if_cancelled()
        return scope, self._queue_of(scope, name)

    def _existing_queue(self, args: dict[str, Any]) -> Queue:
        """For reads: the queue if it exists, else an empty one; creates nothing."""
        scope_id, name = self._queue_address(args)
        scope = self.find_scope(scope_id)
        queue = scope.queues.get(name) if scope is not None else None
        return queue if queue is not None else Queue(scope_id, name)

    def _queue_of(self, scope: Scope, name: str) -> Queue:
        queue = scope.queues.get(name)
        if queue is None:
            queue = scope.queues[name] = Queue(scope.id, name)
            self._queue_scopes.add(scope.id)
        return queue

    def _new_id(self, prefix: str) -> str:
        """The next item id; taken for good when the record that uses it is applied."""
        return f"{prefix}-{self.next_item}"

    # ---- submit and send -------------------------------------------------------------

    def submit(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        scope, queue = self._queue(args)
        key = opt_text(args, "key", Limits.MAX_KEY_BYTES)
        subscriber = opt_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        deadline = args.get("deadline")
        if deadline is not None:
            deadline = check_number(deadline, "deadline", 0, 1e11)
        if "data" not in args:
            raise invalid("data is required (it may be nil)")
        data = args["data"]
        digest = checked_payload("data", data, salt=queue.mailbox)
        if key is not None:
            existing = scope.tasks.get(key)
            if existing is not None:
                if existing.digest != digest:
                    raise CoreError(
                        ErrorCode.IDEMPOTENCY_CONFLICT,
                        f"task key {key!r} in this scope already names a task with other "
                        "input (or another mailbox); use a new key for new work",
                        {"task": existing.id},
                    )
                if subscriber is not None and subscriber not in existing.subscribers:
                    self._subscribe(existing, subscriber, scope.id)
                return {**existing.view(), "created": False}
        rec = (
            Rec.ITEM_ENQUEUED, self._new_id("t"), False, scope.id, queue.mailbox, key,
            digest, data, self.wall(now), deadline,
        )
        self.effects.records.append(rec)
        item = self.apply_enqueued(rec, now)
        assert item is not None
        if subscriber is not None:
            self._subscribe(item, subscriber, scope.id)
        if deadline is not None and deadline <= self.wall(now):
            self._finish(now, item, "deadline", None, "deadline passed before the task started")
        self._dispatch(now, queue)
        return {**item.view(), "created": True}

    def send(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        scope, queue = self._queue(args)
        work_key = opt_text(args, "work_key", Limits.MAX_KEY_BYTES)
        if "data" not in args:
            raise invalid("data is required (it may be nil)")
        data = args["data"]
        digest = checked_payload("data", data, salt=None if work_key is None else "")
        if work_key is not None:
            seen = queue.dedupe.get(work_key)
            if seen is not None and seen[2] > self.wall(now):
                if seen[1] != digest:
                    raise CoreError(
                        ErrorCode.IDEMPOTENCY_CONFLICT,
                        f"work_key {work_key!r} was sent with other data within the dedupe "
                        "window",
                        {"id": seen[0]},
                    )
                return {"id": seen[0], "replay": True}
        rec = (
            Rec.ITEM_ENQUEUED, self._new_id("m"), True, scope.id, queue.mailbox, work_key,
            digest, data, self.wall(now), None,
        )
        self.effects.records.append(rec)
        item = self.apply_enqueued(rec, now)
        assert item is not None
        self._dispatch(now, queue)
        return {"id": item.id, "replay": False}

    def apply_enqueued(self, rec: tuple[Any, ...], now: float) -> Item | None:
        _, item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline = rec
        number = int(item_id.split("-", 1)[1])
        if number < self.next_item:  # replayed again: it exists, or it existed and ended
            return self.items.get(item_id)
        self.next_item = number + 1
        queue = self._queue_of(self.scope_for(scope_id), mailbox)
        # The queue's own strings: one copy per queue, not one per item.
        item = Item(
            item_id, is_message, queue.scope, queue.mailbox, key, digest, data, created, deadline
        )
        if is_message and key is not None:
            self._remember_work_key(item, created + self.dedupe_seconds)
        self._place(item, now)
        return item

    def _remember_work_key(self, item: Item, until: float) -> None:
        queue = self._queue_of(self.scope_for(item.scope), item.mailbox)
        assert item.key is not None and item.digest is not None
        queue.dedupe[item.key] = (item.id, item.digest, until)
        self._at_wall(until, self._dedupe_due, (queue, item.key, item.id))

    def _place(self, item: Item, now: float) -> None:
        """Put an item (new, or rebuilt from a snapshot) where its state says it is."""
        scope = self.scope_for(item.scope)
        self.items[item.id] = item
        if not item.is_message and item.key is not None:
            scope.tasks[item.key] = item
        if item.terminal:
            if item.finished_at is not None:
                if not item.tombstoned:
                    self._at_wall(
                        item.finished_at + self.retention_seconds, self._retention_due, item
                    )
                else:
                    self._at_wall(self._forget_at(item), self._forget_due, item)
            return
        scope.live_items[item.id] = item
        if item.deadline is not None:
            self._at_wall(item.deadline, self._deadline_due, item.id)
        if item.state is State.PENDING:
            if item.visible_at <= self.wall(now):
                item.queued = True
                self._queue_of(scope, item.mailbox).ready.append(item)
            else:
                self._at_wall(item.visible_at, self._visible_due, item.id)

    # ---- receive and deliveries ------------------------------------------------------

    def receive(self, now: float, conn: int, rid: int, holder: str, args: dict[str, Any]) -> Any:
        _, queue = self._queue(args)
        length = lease_seconds(args)
        wait = opt_bool(args, "wait", False)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        item = self._next_ready(queue)
        if item is not None:
            return {"delivery": self._deliver(now, conn, holder, length, item)}
        if not wait or timeout_ms == 0:
            return {"delivery": None}
        consumer = ReceiveWait(
            queue, conn, rid, holder, length, now + timeout_ms / 1000.0, now
        )
        queue.consumers.append(consumer)
        self.waits.add(consumer)
        return DEFERRED

    @staticmethod
    def _next_ready(queue: Queue) -> Item | None:
        ready = queue.ready
        while ready:
            item = ready.popleft()
            if item.queued:
                item.queued = False
                return item
            queue.stale -= 1
        return None

    def _unqueue(self, item: Item) -> None:
        """An item left the ready line without being handed out (it ended): leave its
        entry behind, and compact the line once leftovers are half of it, so that ended
        items (and their payloads) are not kept alive by a queue nobody reads."""
        if not item.queued:
            return
        item.queued = False
        queue = self._queue_of(self.scope_for(item.scope), item.mailbox)
        queue.stale += 1
        if queue.stale == len(queue.ready):
            queue.ready.clear()
            queue.stale = 0
        elif queue.stale > 32 and queue.stale * 2 > len(queue.ready):
            queue.ready = deque(entry for entry in queue.ready if entry.queued)
            queue.stale = 0

    def _dispatch(self, now: float, queue: Queue) -> None:
        """Hand ready items to parked consumers, longest-waiting first."""
        while queue.consumers:
            item = self._next_ready(queue)
            if item is None:
                return
            consumer = queue.consumers.popleft()
            self.waits.served(consumer)
            delivery = self._deliver(
                now, consumer.conn, consumer.holder, consumer.length, item, now - consumer.since
            )
            self.effects.reply(consumer.conn, consumer.request_id, {"delivery": delivery})

    def _deliver(
        self, now: float, conn: int, holder: str, length: float, item: Item,
        waited: float = 0.0,
    ) -> dict[str, Any]:
        rec = (Rec.DELIVERED, item.id, self.leases.next_id, item.attempt + 1, holder, length)
        self.effects.records.append(rec)
        lease = self.apply_delivered(rec, now, conn)
        assert lease is not None
        return {
            "lease": lease.id,
            "id": item.id,
            "kind": "message" if item.is_message else "task",
            "task_id": None if item.is_message else item.id,
            "key": item.key,
            "data": item.data,
            "attempt": item.attempt,
            "lease_seconds": length,
            "waited_ms": int(waited * 1000),
        }

    def apply_delivered(
        self, rec: tuple[Any, ...], now: float, conn: int = 0
    ) -> Lease | None:
        _, item_id, lease_id, attempt, holder, length = rec
        item = self.items.get(item_id)
        if item is None or lease_id < self.leases.next_id:
            return None  # replayed again: that delivery has already begun (and maybe ended)
        if item.queued:  # replay: the live delivery had taken it off the ready line
            self._queue_of(self.scope_for(item.scope), item.mailbox).ready.remove(item)
        item.state = transition(item.state, "deliver")
        item.attempt = attempt
        item.queued = False
        lease = self.leases.add(lease_id, item, holder, conn, length, now)
        item.delivery = lease
        self._queue_of(self.scope_for(item.scope), item.mailbox).running += 1
        return lease

    def _delivery(self, args: dict[str, Any]) -> tuple[Lease, Item]:
        lease_id = req_id(args, "lease")
        lease = self.leases.get(lease_id)
        if lease is None or type(lease.owner) is not Item:
            raise CoreError(
                ErrorCode.STALE_CLAIM,
                f"delivery lease {lease_id} is not current: it expired, was settled or "
                "never existed",
            )
        return lease, lease.owner

    def complete(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        _, item = self._delivery(args)
        outcome = args.get("outcome")
        checked_payload("outcome", outcome)
        self._finish(now, item, "complete", outcome, None)
        return {"id": item.id, "state": State.SUCCEEDED.value}

    def retry(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        _, item = self._delivery(args)
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        delay_ms = args.get("delay_ms")
        if delay_ms is not None:
            delay_ms = int(check_number(delay_ms, "delay_ms", 0, Limits.MAX_RETRY_BACKOFF_MS))
        mailbox = self.mailboxes[item.mailbox]
        if item.attempt >= mailbox.max_attempts:
            self._finish(
                now, item, "attempts_exhausted", None,
                f"attempt limit of {mailbox.max_attempts} reached"
                + (f"; last error: {reason}" if reason else ""),
                dead=True,
            )
            return {"id": item.id, "state": State.FAILED.value, "retry_in_ms": None}
        if delay_ms is None:
            delay_ms = _backoff_ms(item, mailbox.retry_backoff_ms)
        self._requeue(now, item, "retry", delay_ms, reason)
        return {"id": item.id, "state": State.PENDING.value, "retry_in_ms": delay_ms}

    def release(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        """Give a delivery back untouched (a worker shutting down): no attempt used."""
        _, item = self._delivery(args)
        self._requeue(now, item, "release", 0, None)
        return {"id": item.id, "state": State.PENDING.value}

    def reject(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        _, item = self._delivery(args)
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        self._finish(
            now, item, "reject", None, f"rejected: {reason}" if reason else "rejected",
            dead=True,
        )
        return {"id": item.id, "state": State.FAILED.value}

    def expired(self, now: float, lease: Lease) -> None:
        """A delivery's lease ran out: the worker is presumed dead; take the item back."""
        item: Item = lease.owner
        self.effects.push(lease.conn, Push.LEASE_LOST, {"lease": lease.id, "reason": "expired"})
        mailbox = self.mailboxes[item.mailbox]
        if item.attempt >= mailbox.max_attempts:
            self._finish(
                now, item, "attempts_exhausted", None,
                f"lease expired on the last of {mailbox.max_attempts} attempts", dead=True,
            )
        else:
            self._requeue(now, item, "lease_expired", 0, "lease expired")

    def _requeue(
        self, now: float, item: Item, event: str, delay_ms: int, reason: str | None
    ) -> None:
        visible_at = self.wall(now) + delay_ms / 1000.0
        assert item.delivery is not None
        rec = (Rec.REQUEUED, item.id, item.delivery.id, event, visible_at, reason)
        self.effects.records.append(rec)
        self.apply_requeued(rec, now)
        self._dispatch(now, self._queue_of(self.scope_for(item.scope), item.mailbox))

    def apply_requeued(self, rec: tuple[Any, ...], now: float) -> None:
        _, item_id, lease_id, event, visible_at, reason = rec
        item = self.items.get(item_id)
        if item is None or item.delivery is None or item.delivery.id != lease_id:
            return  # replayed again: that delivery is already over
        item.state = transition(item.state, event)
        if event == "release":
            item.attempt -= 1
        if reason is not None:
            item.reason = reason
        self._end_delivery(item)
        item.visible_at = visible_at
        if visible_at <= self.wall(now):
            self._make_ready(item)
        else:
            self._at_wall(visible_at, self._visible_due, item.id)

    def _make_ready(self, item: Item) -> None:
        if item.state is State.PENDING and not item.queued:
            item.queued = True
            self._queue_of(self.scope_for(item.scope), item.mailbox).ready.append(item)

    def _visible_due(self, now: float, item_id: str) -> None:
        # Timers hold ids, not items: an item that ended is not kept alive by its timers.
        item = self.items.get(item_id)
        if item is None or item.state is not State.PENDING or item.queued:
            return
        if self._after(item.visible_at, now):
            self._at_wall(item.visible_at, self._visible_due, item_id)
        else:
            self._make_ready(item)
            self._dispatch(now, self._queue_of(self.scope_for(item.scope), item.mailbox))

    def _end_delivery(self, item: Item) -> Lease | None:
        lease = item.delivery
        if lease is not None:
            item.delivery = None
            self.leases.end(lease)
            self._queue_of(self.scope_for(item.scope), item.mailbox).running -= 1
        return lease

    # ---- endings ---------------------------------------------------------------------

    def _finish(
        self, now: float, item: Item, event: str, outcome: Any, reason: str | None,
        *, dead: bool = False, lost_reason: str | None = None,
    ) -> None:
        state = transition(item.state, event)
        rec = (Rec.FINISHED, item.id, state.value, outcome, reason, self.wall(now), dead)
        self.effects.records.append(rec)
        lease = self.apply_finished(rec, now)
        if lease is not None and event in ("cancel", "deadline"):
            if lost_reason is None:
                lost_reason = "cancelled" if event == "cancel" else "deadline"
            self.effects.push(
                lease.conn, Push.LEASE_LOST, {"lease": lease.id, "reason": lost_reason}
            )
        watchers, item.watchers = item.watchers, ()
        view = item.view()
        for watcher in watchers:
            self.waits.served(watcher)
            self.effects.reply(watcher.conn, watcher.request_id, view)

    def apply_finished(self, rec: tuple[Any, ...], now: float) -> Lease | None:
        _, item_id, state, outcome, reason, finished_at, dead = rec
        item = self.items.get(item_id)
        if item is None or item.terminal:
            return None
        item.state = STATE_BY_NAME[state]
        item.outcome = outcome
        item.reason = reason  # explains non-successful endings only
        item.finished_at = finished_at
        self._unqueue(item)
        lease = self._end_delivery(item)
        scope = self.scope_for(item.scope)
        scope.live_items.pop(item_id, None)
        queue = self._queue_of(scope, item.mailbox)
        if dead:
            item.dead = True
            queue.add_dead_letter({
                "id": item.id,
                "kind": "message" if item.is_message else "task",
                "key": item.key,
                "data": item.data,
                "attempt": item.attempt,
                "reason": item.reason,
                "at": finished_at,
            })
        if item.is_message:
            del self.items[item_id]  # nobody can ask for a message's result
        else:
            self._at_wall(finished_at + self.retention_seconds, self._retention_due, item)
        return lease

    def _deadline_due(self, now: float, item_id: str) -> None:
        item = self.items.get(item_id)
        if item is None or item.terminal:
            return
        if item.deadline is not None and self._after(item.deadline, now):
            self._at_wall(item.deadline, self._deadline_due, item_id)
            return
        self._finish(now, item, "deadline", None, "deadline passed before the task finished")

    def _retention_due(self, now: float, item: Item) -> None:
        if item.tombstoned or item.finished_at is None:
            return
        rec = (Rec.TOMBSTONED, item.id)
        self.effects.records.append(rec)
        self.apply_tombstoned(rec)

    def apply_tombstoned(self, rec: tuple[Any, ...], now: float = 0.0) -> None:
        item = self.items.get(rec[1])
        if item is not None and item.terminal and not item.tombstoned:
            item.tombstoned = True
            item.outcome = None
            item.data = None
            if item.finished_at is not None:
                self._at_wall(self._forget_at(item), self._forget_due, item)

    def _forget_at(self, item: Item) -> float:
        assert item.finished_at is not None
        return item.finished_at + self.retention_seconds + self.tombstone_seconds

    def _forget_due(self, now: float, item: Item) -> None:
        """The tombstone window has passed too: forget the task, so memory stays bounded."""
        if self.items.get(item.id) is not item:
            return
        rec = (Rec.FORGOTTEN, item.id)
        self.effects.records.append(rec)
        self.apply_forgotten(rec)

    def apply_forgotten(self, rec: tuple[Any, ...]) -> None:
        item = self.items.get(rec[1])
        if item is None or not item.tombstoned:
            return
        del self.items[item.id]
        if item.key is not None:
            tasks = self.scope_for(item.scope).tasks
            if tasks.get(item.key) is item:
                del tasks[item.key]

    def _dedupe_due(self, now: float, arg: tuple[Queue, str, str]) -> None:
        queue, key, item_id = arg
        seen = queue.dedupe.get(key)
        if seen is None or seen[0] != item_id:
            return
        rec = (Rec.DEDUPE_EXPIRED, queue.scope, queue.mailbox, key, item_id)
        self.effects.records.append(rec)
        self.apply_dedupe_expired(rec)

    def apply_dedupe_expired(self, rec: tuple[Any, ...]) -> None:
        _, scope_id, mailbox, key, item_id = rec
        queue = self.scope_for(scope_id).queues.get(mailbox)
        if queue is not None and queue.dedupe.get(key, ("",))[0] == item_id:
            del queue.dedupe[key]

    # ---- tickets ---------------------------------------------------------------------

    def _task(self, args: dict[str, Any]) -> Item:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        task_id = req_text(args, "task", Limits.MAX_KEY_BYTES)
        item = self.items.get(task_id)
        if item is None or item.is_message or item.scope != scope_id:
            raise CoreError(ErrorCode.NOT_FOUND, f"no task {task_id!r} in scope {scope_id!r}")
        return item

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._task(args).view()

    def result(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        item = self._task(args)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        if item.terminal:
            return item.view()
        if timeout_ms == 0:
            raise CoreError(ErrorCode.WAIT_TIMEOUT, f"task {item.id} has not finished")
        watcher = ResultWait(item, conn, rid, now + timeout_ms / 1000.0, now)
        if not item.watchers:
            item.watchers = []
        item.watchers.append(watcher)  # type: ignore[union-attr]
        self.waits.add(watcher)
        return DEFERRED

    def join(self, args: dict[str, Any]) -> dict[str, Any]:
        item = self._task(args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        subscriber_scope = opt_text(args, "subscriber_scope", Limits.MAX_SCOPE_ID_BYTES)
        if item.subscribers.get(subscriber, 0) != subscriber_scope:
            self._subscribe(item, subscriber, subscriber_scope)
        return item.view()

    def _subscribe(self, item: Item, subscriber: str, scope: str | None) -> None:
        if subscriber not in item.subscribers and (
            len(item.subscribers) >= Limits.MAX_SUBSCRIBERS_PER_TASK
        ):
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"task {item.id} has {Limits.MAX_SUBSCRIBERS_PER_TASK} subscribers, the limit",
            )
        rec = (Rec.SUBSCRIBED, item.id, subscriber, scope)
        self.effects.records.append(rec)
        self.apply_subscription(rec)

    def detach(self, args: dict[str, Any]) -> dict[str, Any]:
        """Unsubscribe. A task with no subscribers keeps going: only cancel stops it."""
        item = self._task(args)
        subscriber = req_text(args, "subscriber_id", Limits.MAX_SUBSCRIBER_ID_BYTES)
        if subscriber in item.subscribers:
            rec = (Rec.DETACHED, item.id, subscriber)
            self.effects.records.append(rec)
            self.apply_subscription(rec)
        return item.view()

    def apply_subscription(self, rec: tuple[Any, ...]) -> None:
        item = self.items.get(rec[1])
        if item is None:
            return
        if rec[0] == Rec.SUBSCRIBED:
            if not item.subscribers:
                item.subscribers = {}
            item.subscribers[rec[2]] = rec[3]  # type: ignore[index]
        elif rec[2] in item.subscribers:
            item.subscribers.pop(rec[2])  # type: ignore[attr-defined]

    def cancel(self, now: float, args: dict[str, Any]) -> dict[str, Any]:
        item = self._task(args)
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES)
        if not item.terminal:
            self._finish(now, item, "cancel", None, reason or "cancelled")
        return item.view()

    def dead_letter_list(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._existing_queue(args)
        limit = int(opt_number(args, "limit", 100, 1, Limits.MAX_DEAD_LETTERS))
        # Newest last, as many as fit in one reply frame (payloads are up to 256 KiB).
        budget = Limits.MAX_FRAME_BYTES - 64 * 1024
        items: list[dict[str, Any]] = []
        truncated = False
        for entry in reversed(queue.dead_letters):
            if len(items) == limit:
                break
            budget -= _payload_size(entry)
            if budget < 0:
                truncated = True
                break
            items.append(entry)
        items.reverse()
        return {"items": items, "truncated": truncated}

    def inspect(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._existing_queue(args)
        ready = len(queue.ready) - queue.stale
        return {
            "ready": ready,
            "running": queue.running,
            "consumers": len(queue.consumers),
            "dead_letters": len(queue.dead_letters),
        }

    # ---- scope cancellation ----------------------------------------------------------

    def scope_cancelled(self, now: float, scope: Scope) -> int:
        """Cascade a run's cancellation to its queues: consumers, items, deliveries."""
        count = 0
        for queue in scope.queues.values():
            for consumer in list(queue.consumers):
                self.waits.end(consumer, ErrorCode.SCOPE_CANCELLED, scope.cancelled_message())
        for item in list(scope.live_items.values()):
            self._finish(
                now, item, "cancel", None, f"run cancelled: {scope.cancelled}",
                lost_reason="scope cancelled",
            )
            count += 1
        return count

    # ---- snapshots -------------------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """Records that rebuild every mailbox, item, dedupe entry and dead letter."""
        for mailbox in self.mailboxes.values():
            yield (Rec.MAILBOX_ENSURED, mailbox.name, mailbox.mode, mailbox.max_attempts,
                   mailbox.retry_backoff_ms)
        emitted: set[str] = set()
        for item in self._items_in_queue_order():
            emitted.add(item.id)
            yield self._item_record(item)
        for item in self.items.values():
            if item.id not in emitted:
                yield self._item_record(item)
        for scope in list(self._scopes_with_queues()):
            for queue in scope.queues.values():
                for key, (item_id, digest, until) in queue.dedupe.items():
                    yield (Rec.SNAP_DEDUPE, scope.id, queue.mailbox, key, item_id, digest, until)
                for entry in queue.dead_letters:
                    yield (Rec.SNAP_DEAD_LETTER, scope.id, queue.mailbox, entry)

    def _scopes_with_queues(self) -> Iterator[Scope]:
        for scope_id in sorted(self._queue_scopes):
            yield self.scope_for(scope_id)

    def _items_in_queue_order(self) -> Iterator[Item]:
        for scope in self._scopes_with_queues():
            for queue in scope.queues.values():
                for item in queue.ready:
                    if item.queued:
                        yield item

    @staticmethod
    def _item_record(item: Item) -> tuple[Any, ...]:
        lease = item.delivery
        return (
            Rec.SNAP_ITEM, item.id, item.is_message, item.scope, item.mailbox, item.key,
            item.digest, item.data, item.created_at, item.deadline, item.state.value,
            item.attempt, item.outcome, item.reason, item.finished_at, item.tombstoned,
            item.dead, item.visible_at, dict(item.subscribers),
            None if lease is None else (lease.id, lease.holder, lease.length),
        )

    def apply_snapshot(self, rec: tuple[Any, ...], now: float) -> None:
        kind = rec[0]
        if kind == Rec.SNAP_ITEM:
            (_, item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline,
             state, attempt, outcome, reason, finished_at, tombstoned, dead, visible_at,
             subscribers, delivery) = rec
            if item_id in self.items:
                return
            item = Item(
                item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline
            )
            item.state = STATE_BY_NAME[state]
            item.attempt = attempt
            item.outcome = outcome
            item.reason = reason
            item.finished_at = finished_at
            item.tombstoned = tombstoned
            item.dead = dead
            item.visible_at = visible_at
            if subscribers:
                item.subscribers = dict(subscribers)
            self._queue_scopes.add(scope_id)
            self._place(item, now)
            if delivery is not None:
                lease_id, holder, length = delivery
                item.delivery = self.leases.add(lease_id, item, holder, 0, length, now)
                self._queue_of(self.scope_for(scope_id), mailbox).running += 1
        elif kind == Rec.SNAP_DEDUPE:
            _, scope_id, mailbox, key, item_id, digest, until = rec
            queue = self._queue_of(self.scope_for(scope_id), mailbox)
            self._queue_scopes.add(scope_id)
            queue.dedupe[key] = (item_id, digest, until)
            self._at_wall(until, self._dedupe_due, (queue, key, item_id))
        elif kind == Rec.SNAP_DEAD_LETTER:
            _, scope_id, mailbox, entry = rec
            self._queue_scopes.add(scope_id)
            self._queue_of(self.scope_for(scope_id), mailbox).add_dead_letter(entry)

    # ---- helpers ---------------------------------------------------------------------

    def _at_wall(self, wall_time: float, fn: Callable[[float, Any], None], arg: Any) -> None:
        """Schedule ``fn(now, arg)`` for a wall-clock instant."""
        self.wheel.schedule(wall_time - self.wall(0.0), Timer(fn, arg))

    def _after(self, wall_time: float, now: float) -> bool:
        """Whether a wall-clock instant is still ahead of ``now``, computed exactly as
        ``_at_wall`` schedules it, so that a timer that fired never finds it ahead."""
        return wall_time - self.wall(0.0) > now
