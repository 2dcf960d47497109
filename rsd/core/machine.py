"""The Core: all state of rsd and every rule, as a pure deterministic state machine.

The server calls ``handle(now, conn, request_id, op, args)`` for each request,
``tick(now)`` when ``next_deadline()`` is reached, and ``connected`` / ``disconnected``
as connections come and go. Each call returns a reply value (or raises CoreError, or
returns DEFERRED) and leaves journal records and messages for other connections in
``effects``. ``now`` is monotonic seconds from the caller; the core never reads a clock,
never does I/O, and given the same calls produces the same state and effects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsclient.wire import ErrorCode, Limits, Op

from .claims import DEFERRED, ClaimBook
from .effects import Effects
from .errors import CoreError
from .leases import Lease, LeaseTable
from .records import Rec
from .scopes import Scope
from .timerwheel import TimerWheel
from .validate import check_number, invalid, req_id, req_list
from .waits import Waits

__all__ = ["DEFERRED", "Core"]


class Core:
    def __init__(self, new_scope_id: Callable[[], str], wall_offset: float = 0.0) -> None:
        self.new_scope_id = new_scope_id
        self.wall_offset = wall_offset  # wall clock = now + wall_offset; set by the shell
        self.effects = Effects()
        self.wheel = TimerWheel()
        self.leases = LeaseTable(self.wheel)
        self.scopes: dict[str, Scope] = {}
        self.holders: dict[int, str] = {}  # connection id -> holder from its HELLO
        self.waits = Waits(self.wheel, self.effects, Limits.MAX_WAITS_PER_CONNECTION)
        self.claims = ClaimBook(self.leases, self.waits, self.effects, self.scope_for)
        self._ops: dict[int, Callable[[float, int, int, dict[str, Any]], Any]] = {
            Op.SCOPE_CREATE: self._scope_create,
            Op.CLAIM_ACQUIRE: self._claim_acquire,
            Op.LEASE_RENEW: self._lease_renew,
            Op.CLAIM_RELEASE: self._claim_release,
            Op.CLAIM_INSPECT: self._claim_inspect,
            Op.CANCEL: self._cancel,
        }

    # ---- the shell's entry points ---------------------------------------------------

    def handles(self, op: int) -> bool:
        return op in self._ops

    def handle(self, now: float, conn: int, rid: int, op: int, args: dict[str, Any]) -> Any:
        """Run one request. Raises CoreError to refuse it; DEFERRED: reply comes later."""
        handler = self._ops.get(op)
        if handler is None:
            raise CoreError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}")
        return handler(now, conn, rid, args)

    def connected(self, conn: int, holder: str) -> None:
        self.holders[conn] = holder

    def disconnected(self, conn: int) -> None:
        """Waits die with their connection; leases do not (the holder may reconnect)."""
        self.waits.drop_connection(conn)
        self.holders.pop(conn, None)

    def next_deadline(self) -> float | None:
        return self.wheel.next_deadline()

    def tick(self, now: float) -> None:
        for item in self.wheel.pop_due(now):
            if type(item) is Lease:
                if self.leases.check_expired(item, now):
                    self.claims.expired(now, item)
            else:
                item.fire(now)

    def scope_for(self, scope_id: str) -> Scope:
        scope = self.scopes.get(scope_id)
        if scope is None:
            scope = self.scopes[scope_id] = Scope(scope_id, None)
        return scope

    # ---- recovery: the same path live changes take -----------------------------------

    def apply(self, rec: tuple[Any, ...], now: float) -> None:
        kind = rec[0]
        if kind == Rec.CLAIM_GRANTED:
            self.claims.apply_granted(rec, now)
        elif kind == Rec.LEASE_ENDED:
            self.claims.apply_ended(rec)
        elif kind == Rec.LEASE_RESIZED:
            lease = self.leases.get(rec[1])
            if lease is not None:
                lease.length = rec[2]
        elif kind == Rec.SCOPE_CREATED:
            self._apply_scope_created(rec)
        else:
            raise ValueError(f"unknown record type {kind!r}")

    def _apply_scope_created(self, rec: tuple[Any, ...]) -> None:
        scope = self.scope_for(rec[1])
        if scope.created_at is None:
            scope.created_at = rec[2]

    # ---- ops -------------------------------------------------------------------------

    def _scope_create(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        scope_id = self.new_scope_id()
        while scope_id in self.scopes:
            scope_id = self.new_scope_id()
        rec = (Rec.SCOPE_CREATED, scope_id, now + self.wall_offset)
        self.effects.records.append(rec)
        self._apply_scope_created(rec)
        return {"scope": scope_id}

    def _claim_acquire(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return self.claims.acquire(now, conn, rid, self.holders.get(conn, ""), args)

    def _claim_release(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return self.claims.release(now, conn, args)

    def _claim_inspect(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return self.claims.inspect(args)

    def _cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return {"cancelled": self.waits.cancel(conn, req_id(args, "request"))}

    def _lease_renew(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Renew many leases in one request; each item gets its own outcome.

        The whole batch is checked before any lease is touched: one malformed item
        refuses the request. A lease that is not live gets STALE_CLAIM in its slot.
        """
        items = req_list(args, "leases", Limits.MAX_RENEW_BATCH)
        parsed: list[tuple[int, float | None]] = []
        for item in items:
            if type(item) is int:
                parsed.append((item, None))
                continue
            if not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int:
                raise invalid("each item of leases must be a lease id or [lease id, seconds]")
            seconds = item[1]
            if seconds is not None:
                seconds = check_number(
                    seconds, "lease_seconds", Limits.MIN_LEASE_SECONDS, Limits.MAX_LEASE_SECONDS
                )
            parsed.append((item[0], seconds))
        results: list[str | None] = []
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
            "connections": len(self.holders),
        }


