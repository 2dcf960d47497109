"""Quotas: a tenant's token buckets, refilled continuously, with FIFO waiters.

What always holds:
- a quota is named per tenant, ``(tenant, name)``; it exists once ensured (QUOTA_ENSURE,
  declarative) and is never forgotten: at most ``max_quotas_per_tenant`` per tenant;
- its state is ``level`` at the wall-clock instant ``level_wall``; at any later instant
  the level is ``min(limit, level + elapsed * limit / per_seconds)``: it refills
  continuously at ``limit`` per ``per_seconds``, and ``limit`` is also the burst. The
  level is computed from the core's ``now`` through the tables' wall clock, never read
  from a clock, and every take is a QUOTA_TAKEN record carrying the level it left and
  when, so a restart resumes the bucket where it was (refilled for the time that passed);
- a take never makes the level negative, and an amount above the limit is refused
  (INVALID_ARGUMENT naming the limit): it could never be served;
- waiters queue strictly FIFO: nobody passes the head, so a large amount is not starved
  by small ones behind it, and a non-waiting take is QUOTA_EXHAUSTED while anyone waits.
  The server serves them itself: one wheel timer per quota, armed at the instant the
  head's amount will be there (re-armed when the head changes), and served takes are
  answered by their deferred replies; nothing polls;
- a waiter is a Wait (waits.py): served, timed out, cancelled or dropped with its
  connection, leaving the line in O(1) amortised; at most ``max_waiters_per_quota``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..ground.effects import DEFERRED
from ..ground.errors import CoreError
from ..ground.pages import PagedIndex
from ..ground.validate import check_number, int_arg, opt_bool, opt_number, req_text
from ..ground.waits import Wait, WaitLine, leave_line
from ..records import QuotaEnsured, QuotaTaken, Rec
from ..state.tables import Applier, Handler, Tables
from ..tenant.quota import Quota, QuotaKey

__all__ = ["Quota", "QuotaBook"]

def _always(quota: Quota) -> bool:
    return True


class QuotaWaiter(Wait):
    """A QUOTA_TAKE parked in a quota's FIFO line."""

    __slots__ = ("amount", "book", "quota")

    def __init__(
        self, book: QuotaBook, quota: Quota, amount: int, conn: int, request_id: int,
        deadline: float, since: float,
    ) -> None:
        super().__init__(conn, request_id, deadline, since)
        self.book = book
        self.quota = quota
        self.amount = amount

    def withdraw(self) -> None:
        quota = self.quota
        leave_line(quota, self)
        self.book.arm(quota)  # the head may have changed: its timer follows
        if not quota.waiters:
            self.book.events.capacity_freed(quota)

    def timeout_message(self) -> str:
        return f"quota {self.quota.name!r} did not have {self.amount} when the wait timed out"


class QuotaBook:
    """The quota rules. Owned by the Core, which hands it the shared tables."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.waits = tables.waits
        self.effects = tables.effects
        self.quotas: dict[QuotaKey, Quota] = {}
        self.per_tenant: dict[str, int] = {}
        self.pages: dict[str, PagedIndex[Quota]] = {}  # tenant -> its quotas (admin.py)
        self.events = tables.events  # capacity_freed: its line of waiters is empty again
        self.ops: dict[int, Handler] = {
            Op.QUOTA_ENSURE: self.ensure,
            Op.QUOTA_TAKE: self.take,
            Op.QUOTA_INSPECT: self.inspect,
        }
        self.appliers: dict[int, Applier] = {
            Rec.QUOTA_ENSURED: self.apply_ensured,
            Rec.QUOTA_TAKEN: self.apply_taken,
        }

    # ---- ops -------------------------------------------------------------------------

    def ensure(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant = self.tables.tenant_of(conn)
        name = req_text(args, "name", Limits.MAX_QUOTA_NAME_BYTES)
        limit = int_arg(args, "limit", 1, Limits.MAX_QUOTA_LIMIT)
        if args.get("per_seconds") is None:
            raise CoreError(ErrorCode.INVALID_ARGUMENT, "per_seconds is required")
        per_seconds = check_number(
            args["per_seconds"], "per_seconds", Limits.MIN_QUOTA_PER_SECONDS,
            Limits.MAX_QUOTA_PER_SECONDS,
        )
        wall = self.tables.wall(now)
        quota = self.quotas.get((tenant, name))
        created = quota is None
        if quota is None:
            if self.per_tenant.get(tenant, 0) >= Limits.MAX_QUOTAS_PER_TENANT:
                raise CoreError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"this tenant already has {Limits.MAX_QUOTAS_PER_TENANT} quotas, the limit",
                )
            level = float(limit)  # a new bucket starts full
        else:
            level = min(float(limit), quota.level_at(wall))
        if quota is None or (quota.limit, quota.per_seconds) != (limit, per_seconds):
            rec = QuotaEnsured(Rec.QUOTA_ENSURED, tenant, name, limit, per_seconds, level, wall)
            quota = self.tables.commit(rec, now)
            assert quota is not None
            self._serve(now, quota)  # another rate or limit moves the head's instant
        return {**self.view(quota, wall), "created": created}

    def take(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self.tables.tenant_of(conn)
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        name = req_text(args, "quota", Limits.MAX_QUOTA_NAME_BYTES)
        amount = int_arg(args, "amount", 1, Limits.MAX_QUOTA_LIMIT, 1)
        wait = opt_bool(args, "wait", False)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        quota = self._find(tenant, name)
        if amount > quota.limit:
            raise CoreError(
                ErrorCode.INVALID_ARGUMENT,
                f"amount {amount} is above the limit of quota {name!r}, {quota.limit}: "
                "it could never be taken",
            )
        # None: a run of another shard, which this one cannot see (poolbook.py's notes):
        # its waiter is not ended by the run's cancellation, only by its timeout, its
        # withdrawal or its connection; a take spends tokens and holds nothing after.
        scope = self.tables.holding_run(tenant, scope_id)
        if scope is not None:
            scope.refuse_if_cancelled()
        wall = self.tables.wall(now)
        level = quota.level_at(wall)
        if not quota.waiters and quota.enough(level, amount):
            return self._take(now, quota, amount, level, wall, 0.0)
        if not wait:
            ahead = len(quota.waiters)
            raise CoreError(
                ErrorCode.QUOTA_EXHAUSTED,
                f"quota {name!r} has {level:.6g} of its {quota.limit} left"
                + (f" and {ahead} waiters ahead" if ahead else "")
                + f"; {amount} asked",
                {"level": level, "limit": quota.limit, "waiters": ahead},
            )
        if timeout_ms == 0:
            raise CoreError(
                ErrorCode.WAIT_TIMEOUT, f"quota {name!r} cannot give {amount} now; timeout_ms is 0"
            )
        if len(quota.waiters) >= Limits.MAX_WAITERS_PER_QUOTA:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"quota {name!r} already has {Limits.MAX_WAITERS_PER_QUOTA} waiters, the limit",
            )
        waiter = QuotaWaiter(self, quota, amount, conn, rid, now + timeout_ms / 1000.0, now)
        waiter.run = scope  # its cancellation ends it
        if not quota.waiters:
            quota.waiters = WaitLine()
        quota.waiters.append(waiter)
        self.waits.add(waiter)
        self.arm(quota)
        return DEFERRED

    def inspect(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant = self.tables.tenant_of(conn)
        name = req_text(args, "name", Limits.MAX_QUOTA_NAME_BYTES)
        return self.view(self._find(tenant, name), self.tables.wall(now))

    # ---- taking for another request (a delivery that needs capacity) ------------------

    def can_take(self, now: float, quota: Quota, amount: int) -> bool:
        """Whether a take of ``amount`` made now is served at once (nobody waits, the
        level covers it). Changes nothing."""
        return not quota.waiters and quota.enough(quota.level_at(self.tables.wall(now)), amount)

    def spend(self, now: float, quota: Quota, amount: int) -> float:
        """Take ``amount`` (after ``can_take``): one QUOTA_TAKEN record; the level left."""
        wall = self.tables.wall(now)
        self._take(now, quota, amount, quota.level_at(wall), wall, 0.0)
        return quota.level

    # ---- serving waiters -------------------------------------------------------------

    def arm(self, quota: Quota) -> None:
        """Set the quota's one timer for the instant its head waiter can be served (none
        without waiters). Pure arithmetic on the recorded state: reads no clock."""
        tables = self.tables
        if quota.timer_at is not None:
            tables.cancel_at_wall(quota.timer_at, self._due, quota)
            quota.timer_at = None
        head = quota.waiters.peek() if quota.waiters else None
        if head is None:
            return
        assert isinstance(head, QuotaWaiter)
        if head.amount > quota.limit:  # above a lowered limit: ended at once, when due
            quota.timer_at = quota.level_wall
        else:
            quota.timer_at = quota.ready_wall(head.amount)
        tables.at_wall(quota.timer_at, self._due, quota)

    def _due(self, now: float, quota: Quota) -> None:
        quota.timer_at = None  # the wheel gave it back
        self._serve(now, quota)

    def _serve(self, now: float, quota: Quota) -> None:
        """Serve waiters from the head while the level covers them, then re-arm."""
        wall = self.tables.wall(now)
        level = quota.level_at(wall)
        while quota.waiters:
            waiters = quota.waiters
            assert isinstance(waiters, WaitLine)
            head = waiters.peek()
            if head is None:
                quota.waiters = ()
                break
            assert isinstance(head, QuotaWaiter)
            if head.amount > quota.limit:  # the limit was lowered under it
                waiters.popleft()
                self.waits.served(head)
                self.effects.error(
                    head.conn, head.request_id, ErrorCode.INVALID_ARGUMENT,
                    f"amount {head.amount} is above the limit of quota {quota.name!r}, "
                    f"{quota.limit}, since it was lowered: it could never be taken",
                )
                continue
            if not quota.enough(level, head.amount):
                break
            waiters.popleft()
            self.waits.served(head)
            reply = self._take(now, quota, head.amount, level, wall, now - head.since)
            self.effects.reply(head.conn, head.request_id, reply)
            level = quota.level
        if isinstance(quota.waiters, WaitLine) and not quota.waiters:
            quota.waiters = ()
        self.arm(quota)
        if not quota.waiters:
            self.events.capacity_freed(quota)

    def _take(
        self, now: float, quota: Quota, amount: int, level: float, wall: float, waited: float
    ) -> dict[str, Any]:
        left = max(0.0, level - amount)
        self.tables.commit(QuotaTaken(Rec.QUOTA_TAKEN, quota.tenant, quota.name, left, wall), now)
        return {"taken": amount, "level": left, "waited_ms": int(waited * 1000)}

    # ---- records ---------------------------------------------------------------------

    def apply_ensured(self, rec: QuotaEnsured, now: float) -> Quota:
        _, tenant, name, limit, per_seconds, level, level_wall = rec
        quota = self.quotas.get((tenant, name))
        if quota is None:
            quota = self.quotas[(tenant, name)] = Quota(
                tenant, name, limit, per_seconds, level, level_wall
            )
            self.per_tenant[tenant] = self.per_tenant.get(tenant, 0) + 1
            pages = self.pages.get(tenant)
            if pages is None:  # quotas are never removed: every entry stays alive
                pages = self.pages[tenant] = PagedIndex(_always)
            pages.add(quota)
            return quota
        quota.limit = limit
        quota.per_seconds = per_seconds
        quota.level = level
        quota.level_wall = level_wall
        return quota

    def apply_taken(self, rec: QuotaTaken, now: float) -> None:
        _, tenant, name, level, level_wall = rec
        quota = self.quotas.get((tenant, name))
        if quota is not None:
            quota.level = level
            quota.level_wall = level_wall

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """One QUOTA_ENSURED per quota: its definition and its level, its whole state."""
        for q in self.quotas.values():
            yield QuotaEnsured(Rec.QUOTA_ENSURED, q.tenant, q.name, q.limit, q.per_seconds, q.level,
                   q.level_wall)

    # ---- internals -------------------------------------------------------------------

    def view(self, quota: Quota, wall: float) -> dict[str, Any]:
        """QUOTA_INSPECT's answer, and each row of ADMIN_QUOTAS (admin.py)."""
        head = quota.waiters.peek() if quota.waiters else None
        return {
            "name": quota.name,
            "limit": quota.limit,
            "per_seconds": quota.per_seconds,
            "level": quota.level_at(wall),
            "waiters": len(quota.waiters),
            "head_amount": head.amount if isinstance(head, QuotaWaiter) else None,
        }

    def _find(self, tenant: str, name: str) -> Quota:
        quota = self.quotas.get((tenant, name))
        if quota is None:
            raise CoreError(
                ErrorCode.NOT_FOUND, f"quota {name!r} does not exist: ensure it first"
            )
        return quota
