"""The Core: all state of rsd and every rule, as a pure deterministic state machine.

The server calls ``handle(now, conn, request_id, op, args)`` for each request,
``tick(now)`` when ``next_deadline()`` is reached, and ``connected`` / ``disconnected``
as connections come and go. Each call returns a reply value (or raises CoreError, or
returns DEFERRED) and leaves journal records and messages for other connections in
``effects``. ``now`` is monotonic seconds from the caller; the core never reads a clock,
never does I/O, and given the same calls produces the same state and effects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..policy import Policy
from .claims import Claim, ClaimBook
from .effects import DEFERRED, Effects
from .errors import CoreError
from .ids import Ids
from .leases import Lease, LeaseTable
from .queues import WorkBook
from .records import Rec
from .scopes import Scope
from .timerwheel import TimerWheel
from .validate import check_number, invalid, opt_text, req_id, req_list, req_text
from .waits import Waits

__all__ = [
    "DEFAULT_DEDUPE_SECONDS",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_TOMBSTONE_SECONDS",
    "DEFERRED",
    "Core",
]

_RENEW = int(Op.LEASE_RENEW)
_STALE = ErrorCode.STALE_CLAIM.value

DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
DEFAULT_DEDUPE_SECONDS = 7 * 24 * 3600
DEFAULT_TOMBSTONE_SECONDS = 30 * 24 * 3600


class Core:
    def __init__(
        self,
        new_scope_id: Callable[[], str],
        wall_offset: float = 0.0,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        dedupe_seconds: float = DEFAULT_DEDUPE_SECONDS,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
    ) -> None:
        self.new_scope_id = new_scope_id
        self.wall_offset = wall_offset  # wall clock = now + wall_offset; set by the shell
        self.effects = Effects()
        self.wheel = TimerWheel()
        self.leases = LeaseTable(self.wheel)
        self.scopes: dict[str, Scope] = {}
        self.holders: dict[int, str] = {}  # connection id -> holder from its HELLO
        self.waits = Waits(self.wheel, self.effects, Policy.MAX_WAITS_PER_CONNECTION)
        self.ids = Ids()
        self.claims = ClaimBook(
            self.leases, self.waits, self.effects, self.scope_for, self.scopes.get, self.ids
        )
        self.work = WorkBook(
            self.leases, self.wheel, self.waits, self.effects, self.scope_for,
            self.scopes.get, self.wall,
            retention_seconds, dedupe_seconds, tombstone_seconds,
        )
        work = self.work
        self._appliers = self._record_appliers()
        self._ops: dict[int, Callable[[float, int, int, dict[str, Any]], Any]] = {
            Op.SCOPE_CREATE: self._scope_create,
            Op.SCOPE_CANCEL: self._scope_cancel,
            Op.CLAIM_ACQUIRE: self._claim_acquire,
            Op.LEASE_RENEW: self._lease_renew,
            Op.CLAIM_RELEASE: lambda now, conn, rid, args: self.claims.release(now, conn, args),
            Op.CLAIM_INSPECT: lambda now, conn, rid, args: self.claims.inspect(args),
            Op.CANCEL: self._cancel,
            Op.MAILBOX_ENSURE: lambda now, conn, rid, args: work.ensure(args),
            Op.TASK_SUBMIT: lambda now, conn, rid, args: work.submit(now, args),
            Op.MESSAGE_SEND: lambda now, conn, rid, args: work.send(now, args),
            Op.RECEIVE: self._receive,
            Op.DELIVERY_COMPLETE: lambda now, conn, rid, args: work.complete(now, args),
            Op.DELIVERY_RETRY: lambda now, conn, rid, args: work.retry(now, args),
            Op.DELIVERY_RELEASE: lambda now, conn, rid, args: work.release(now, args),
            Op.DELIVERY_REJECT: lambda now, conn, rid, args: work.reject(now, args),
            Op.DEAD_LETTERS: lambda now, conn, rid, args: work.dead_letter_list(args),
            Op.QUEUE_INSPECT: lambda now, conn, rid, args: work.inspect(args),
            Op.TASK_STATUS: lambda now, conn, rid, args: work.status(args),
            Op.TASK_RESULT: work.result,
            Op.TASK_JOIN: lambda now, conn, rid, args: work.join(args),
            Op.TASK_DETACH: lambda now, conn, rid, args: work.detach(args),
            Op.TASK_CANCEL: lambda now, conn, rid, args: work.cancel(now, args),
        }

    # ---- the shell's entry points ---------------------------------------------------

    def handles(self, op: int) -> bool:
        return op in self._ops

    def handle(self, now: float, conn: int, rid: int, op: int, args: dict[str, Any]) -> Any:
        """Run one request. Raises CoreError to refuse it; DEFERRED: reply comes later."""
        if op == _RENEW and type(op) is int:
            return self._lease_renew(now, conn, rid, args)  # the hot path: allocates no ids
        handler = self._ops.get(op) if isinstance(op, int) and type(op) is not bool else None
        if handler is None:
            raise CoreError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}")
        try:
            return handler(now, conn, rid, args)
        finally:
            self.ids.reserve_if_needed(self.leases.next_id, self.work.next_item, self.effects)

    def connected(self, conn: int, holder: str) -> None:
        self.holders[conn] = holder

    def disconnected(self, conn: int) -> None:
        """Waits die with their connection; leases do not (the holder may reconnect)."""
        self.waits.drop_connection(conn)
        self.holders.pop(conn, None)

    def next_deadline(self) -> float | None:
        return self.wheel.next_deadline()

    def tick(self, now: float) -> None:
        """Fire everything due by ``now``, including what firing makes due (a tombstone
        whose forgetting is already past, after a long pause)."""
        due = self.wheel.pop_due(now)
        if not due:
            return
        passes = 0
        while due:
            for item in due:
                if type(item) is Lease:
                    if self.leases.check_expired(item, now):
                        if type(item.owner) is Claim:
                            self.claims.expired(now, item)
                        else:
                            self.work.expired(now, item)
                else:
                    item.fire(now)
            passes += 1
            if passes == 64:
                break  # bounded: what is still due is fired at the next tick, at once
            due = self.wheel.pop_due(now)
        self.ids.reserve_if_needed(self.leases.next_id, self.work.next_item, self.effects)

    def recovered(self, now: float, clean: bool) -> None:
        """Called once after recovery, before serving. Jumps the counters after a crash."""
        if not clean:
            delta = max(0, self.ids.lease_ceiling - self.leases.next_id)
            rec = (Rec.IDS_JUMPED, delta)
            self.effects.records.append(rec)
            self._apply_jump(rec)
        self.ids.reserve(self.leases.next_id, self.work.next_item, self.effects)

    def reserve_ids_from(self, floor: int) -> None:
        """After a repair: move the id ceilings to at least ``floor`` (a record)."""
        rec = (
            Rec.IDS_RESERVED,
            max(floor, self.ids.lease_ceiling),
            max(floor, self.ids.item_ceiling),
        )
        self.effects.records.append(rec)
        self.ids.apply_reserved(rec)

    def _apply_jump(self, rec: tuple[Any, ...]) -> None:
        delta = rec[1]
        self.leases.next_id = max(self.leases.next_id, self.ids.lease_ceiling)
        self.work.next_item = max(self.work.next_item, self.ids.item_ceiling)
        self.ids.generation_floor += delta
        self.claims.jump_generations(self.scopes, delta)

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """Records that rebuild the whole live state (for a snapshot file)."""
        ids = self.ids
        yield (Rec.SNAP_COUNTERS, self.leases.next_id, self.work.next_item,
               ids.lease_ceiling, ids.item_ceiling, ids.generation_floor)
        for scope in self.scopes.values():
            if scope.created_at is not None or scope.cancelled is not None:
                yield (Rec.SNAP_SCOPE, scope.id, scope.created_at, scope.cancelled)
        yield from self.claims.snapshot(self.scopes)
        yield from self.work.snapshot()

    def wall(self, now: float) -> float:
        return now + self.wall_offset

    def scope_for(self, scope_id: str) -> Scope:
        scope = self.scopes.get(scope_id)
        if scope is None:
            scope = self.scopes[scope_id] = Scope(scope_id, None)
        return scope

    # ---- recovery: the same path live changes take -----------------------------------

    def apply(self, rec: tuple[Any, ...], now: float) -> None:
        applier = self._appliers.get(rec[0])
        if applier is None:
            raise ValueError(f"unknown record type {rec[0]!r}")
        applier(rec, now)

    def _record_appliers(self) -> dict[int, Callable[[Any, float], Any]]:
        claims, work, ids = self.claims, self.work, self.ids
        return {
            Rec.CLAIM_GRANTED: claims.apply_granted,
            Rec.LEASE_ENDED: lambda rec, now: claims.apply_ended(rec),
            Rec.LEASE_RESIZED: self._apply_resized,
            Rec.SCOPE_CREATED: lambda rec, now: self._apply_scope_created(rec),
            Rec.SCOPE_CANCELLED: lambda rec, now: self._apply_scope_cancelled(rec),
            Rec.MAILBOX_ENSURED: lambda rec, now: work.apply_mailbox(rec),
            Rec.ITEM_ENQUEUED: work.apply_enqueued,
            Rec.DELIVERED: work.apply_delivered,
            Rec.REQUEUED: work.apply_requeued,
            Rec.FINISHED: work.apply_finished,
            Rec.SUBSCRIBED: lambda rec, now: work.apply_subscription(rec),
            Rec.DETACHED: lambda rec, now: work.apply_subscription(rec),
            Rec.TOMBSTONED: lambda rec, now: work.apply_tombstoned(rec),
            Rec.FORGOTTEN: lambda rec, now: work.apply_forgotten(rec),
            Rec.DEDUPE_EXPIRED: lambda rec, now: work.apply_dedupe_expired(rec),
            Rec.IDS_RESERVED: lambda rec, now: ids.apply_reserved(rec),
            Rec.IDS_JUMPED: lambda rec, now: self._apply_jump(rec),
            Rec.CLEAN_SHUTDOWN: lambda rec, now: None,
            Rec.SNAP_COUNTERS: lambda rec, now: self._apply_counters(rec),
            Rec.SNAP_SCOPE: lambda rec, now: self._apply_scope_state(rec),
            Rec.SNAP_CLAIM: claims.apply_snapshot,
            Rec.SNAP_ITEM: work.apply_snapshot,
            Rec.SNAP_DEDUPE: work.apply_snapshot,
            Rec.SNAP_DEAD_LETTER: work.apply_snapshot,
        }

    def _apply_resized(self, rec: tuple[Any, ...], now: float) -> None:
        lease = self.leases.get(rec[1])
        if lease is not None:
            self.leases.renew(lease, now, rec[2], lease.conn)

    def _apply_counters(self, rec: tuple[Any, ...]) -> None:
        _, next_lease, next_item, lease_ceiling, item_ceiling, floor = rec
        self.leases.next_id = max(self.leases.next_id, next_lease)
        self.work.next_item = max(self.work.next_item, next_item)
        self.ids.apply_reserved((Rec.IDS_RESERVED, lease_ceiling, item_ceiling))
        self.ids.generation_floor = max(self.ids.generation_floor, floor)

    def _apply_scope_state(self, rec: tuple[Any, ...]) -> None:
        scope = self.scope_for(rec[1])
        scope.created_at = rec[2]
        scope.cancelled = rec[3]

    def _apply_scope_created(self, rec: tuple[Any, ...]) -> None:
        scope = self.scope_for(rec[1])
        if scope.created_at is None:
            scope.created_at = rec[2]

    def _apply_scope_cancelled(self, rec: tuple[Any, ...]) -> None:
        scope = self.scope_for(rec[1])
        if scope.cancelled is None:
            scope.cancelled = rec[2]

    # ---- ops -------------------------------------------------------------------------

    def _scope_create(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        scope_id = self.new_scope_id()
        while scope_id in self.scopes:
            scope_id = self.new_scope_id()
        rec = (Rec.SCOPE_CREATED, scope_id, now + self.wall_offset)
        self.effects.records.append(rec)
        self._apply_scope_created(rec)
        return {"scope": scope_id}

    def _scope_cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Cancel a run: refuse new work in it and end everything it holds or waits on."""
        scope = self.scope_for(req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES))
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES) or "cancelled"
        if scope.cancelled is not None:
            return {"scope": scope.id, "cancelled": True, "tasks": 0, "claims": 0}
        rec = (Rec.SCOPE_CANCELLED, scope.id, reason, self.wall(now))
        self.effects.records.append(rec)
        self._apply_scope_cancelled(rec)
        claims = self.claims.scope_cancelled(now, scope)
        tasks = self.work.scope_cancelled(now, scope)
        return {"scope": scope.id, "cancelled": True, "tasks": tasks, "claims": claims}

    def _claim_acquire(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return self.claims.acquire(now, conn, rid, self.holders.get(conn, ""), args)

    def _receive(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return self.work.receive(now, conn, rid, self.holders.get(conn, ""), args)

    def _cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return {"cancelled": self.waits.cancel(conn, req_id(args, "request"))}

    def _lease_renew(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Renew many leases in one request; each item gets its own outcome.

        The whole batch is checked before any lease is touched: one malformed item
        refuses the request. A lease that is not live gets STALE_CLAIM in its slot.
        """
        items = args.get("leases")
        if type(items) is list and len(items) <= Limits.MAX_RENEW_BATCH:
            for item in items:
                if type(item) is not int or item < 0:
                    break
            else:
                # The common batch (plain ids, same lengths): no record, no wheel work.
                results: list[str | None] = []
                live = self.leases.live
                for lease_id in items:
                    lease = live.get(lease_id)
                    if lease is None:
                        results.append(_STALE)
                    else:
                        lease.expires_at = now + lease.length
                        lease.conn = conn
                        results.append(None)
                return {"results": results}
        items = req_list(args, "leases", Limits.MAX_RENEW_BATCH)
        parsed: list[tuple[int, float | None]] = []
        for item in items:
            if type(item) is int and item >= 0:
                parsed.append((item, None))
                continue
            if (
                not isinstance(item, list)
                or len(item) != 2
                or type(item[0]) is not int
                or item[0] < 0
            ):
                raise invalid(
                    "each item of leases must be a lease id (a non-negative integer) or "
                    "[lease id, seconds]"
                )
            seconds = item[1]
            if seconds is not None:
                seconds = check_number(
                    seconds, "lease_seconds", Limits.MIN_LEASE_SECONDS, Limits.MAX_LEASE_SECONDS
                )
            parsed.append((item[0], seconds))
        results = []
        leases = self.leases
        for lease_id, seconds in parsed:
            lease = leases.get(lease_id)
            if lease is None:
                results.append(ErrorCode.STALE_CLAIM.value)
                continue
            if seconds is not None and seconds != lease.length:
                self.effects.records.append((Rec.LEASE_RESIZED, lease_id, seconds))
            leases.renew(lease, now, seconds, conn)
            results.append(None)
        return {"results": results}

    # ---- introspection ---------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {
            "scopes": len(self.scopes),
            "leases": len(self.leases),
            "items": len(self.work.items),
            "mailboxes": len(self.work.mailboxes),
            "waits": self.waits.total(),
            "timers": len(self.wheel),
        }


