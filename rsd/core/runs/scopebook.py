"""Scopes (runs): the namespace every claim, task and queue lives in.

A scope exists once it is created: SCOPE_CREATE makes a fresh id (given a
``placement``, ``{placement}`` and 24 hexadecimal digits: the run lives in the placement's
slot, rsproto/slots.py), or, given ``scope``,
a run with that chosen id (idempotent: a run of the caller's tenant with that id is
returned as it is, ``created: false``). Workers attach to a run whose id they were
handed; every op naming a run that was never created is NOT_FOUND (``Tables.run``), so a
mistyped id fails at once instead of waiting in an empty run. A key inside one scope
never collides with the same key inside another. Runs made by first use, which older
journals hold, are kept: ``Core.recovered`` records each one left as created. A cancelled scope
refuses new work (SCOPE_CANCELLED) but still answers reads; cancelling ends everything
the run holds or waits on, each ending its own record after the SCOPE_CANCELLED one
(the parts that hold something of a run hear ``run_cancelled``, events.py):
its claim, pool and quota waits and parked consumers are refused (SCOPE_CANCELLED),
its claims and pool slots end (LEASE_LOST, reason "scope cancelled"; the pools' other
waiters get the slots), and its unfinished tasks end CANCELLED (result waiters told,
running deliveries pushed LEASE_LOST and their settlements refused); claims and tasks
are ended in slices across loop turns (cascade.py), the first within the request. SCOPE_STATUS
reports a run from counters kept as things change (O(1), never a walk).
The table is keyed by ``ScopeKey``, ``(tenant, scope id)``: a tenant only ever finds
its own runs, and another tenant's run of the same id is, for it, a run that does not
exist (tenants.py). A new run counts against its tenant's ``runs`` limit.

A fresh id without a placement is drawn from ``new_scope_id`` (the shell's source of
randomness) until it is unused and ``placeable`` (the shell's predicate: its slot is one
this shard serves, slotowner.py; every id of a server alone). The core stays
deterministic for what it is given: the ids drawn and the predicate's answers are inputs,
as the randomness is, and the SCOPE_CREATED record carries the id recovery replays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op
from rsproto.slots import placed_id, placement_problem

from ..ground.errors import CoreError
from ..ground.tenants import MAX_TENANT_BYTES
from ..ground.validate import invalid, opt_text, req_text
from ..records import Rec, ScopeCancelled, ScopeCreated
from ..records.snaprecords import SnapScope
from ..run.scope import Scope
from ..state.tables import Applier, Handler, Tables
from .runends import RunEnds

__all__ = ["ScopeBook", "everywhere", "scope_record"]


def everywhere(scope_id: str) -> bool:
    """The predicate of a server alone: every fresh id is placeable."""
    return True


class ScopeBook:
    """SCOPE_CREATE and SCOPE_CANCEL and their records. Owned by the Core."""

    def __init__(
        self, tables: Tables, new_scope_id: Callable[[], str], run_ends: RunEnds
    ) -> None:
        self.tables = tables
        self.new_scope_id = new_scope_id
        # Whether a fresh id (no placement) may be given here: the shell's (slotowner.py).
        self.placeable: Callable[[str], bool] = everywhere
        self.run_ends = run_ends
        self.ops: dict[int, Handler] = {
            Op.SCOPE_CREATE: self.create,
            Op.SCOPE_CANCEL: self.cancel,
            Op.SCOPE_STATUS: self.status,
        }
        self.appliers: dict[int, Applier] = {
            Rec.SCOPE_CREATED: self.apply_created,
            Rec.SCOPE_CANCELLED: self.apply_cancelled,
            Rec.SNAP_SCOPE: self.apply_snapshot,
        }

    def create(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Make a run: a fresh id, or the chosen ``scope`` id. The chosen form is
        idempotent: the caller's tenant's run of that id, if any, is returned as it is
        (``created: false``), so every process of a job may create it at start. A
        ``placement`` (not with ``scope``) tags the fresh id: its slot is the placement's."""
        tables = self.tables
        tenant = tables.tenant_of(conn)
        chosen = opt_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        placement = args.get("placement")
        if placement is not None:
            problem = placement_problem(placement)
            if problem is not None:
                raise invalid(problem)
            if chosen is not None:
                raise invalid("placement places a fresh id: give scope (a chosen id) or "
                              "placement, not both")
        if chosen is not None:
            existing = tables.scopes.get((tenant, chosen))
            if existing is not None:
                tables.release_scope(existing)  # quiet: a fresh window (runends.py)
                return {"scope": chosen, "created": False}
        tables.tenants.room(tenant, "runs")
        scope_id = chosen
        if scope_id is None:
            scope_id = self._fresh(tenant, placement)
        tables.commit(ScopeCreated(Rec.SCOPE_CREATED, scope_id, tables.wall(now), tenant), now)
        return {"scope": scope_id, "created": True}

    def _fresh(self, tenant: str, placement: str | None) -> str:
        """An unused id: tagged with ``placement``, or else ``placeable``. A shard that
        owns a slot in N draws one in slots/N draws on average (the shell answers MOVED
        instead when it owns none: nothing here could be placeable)."""
        scopes = self.tables.scopes
        if placement is not None:
            scope_id = placed_id(placement, self.new_scope_id())
            while (tenant, scope_id) in scopes:
                scope_id = placed_id(placement, self.new_scope_id())
            return scope_id
        placeable = self.placeable
        scope_id = self.new_scope_id()
        while (tenant, scope_id) in scopes or not placeable(scope_id):
            scope_id = self.new_scope_id()
        return scope_id

    def cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Cancel a run: refuse new work in it and end everything it holds or waits on.
        ``tenant`` names another tenant's run: an admin-only op."""
        tables = self.tables
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        tenant = opt_text(args, "tenant", MAX_TENANT_BYTES)
        if tenant is None or tenant == tables.tenant_of(conn):
            tenant = tables.tenant_of(conn)
        else:
            tables.tenants.require_admin(conn, "cancelling another tenant's run")
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES) or "cancelled"
        scope = tables.run(tenant, scope_id)
        if scope.cancelled is not None:
            return {"scope": scope.id, "cancelled": True, "tasks": 0, "claims": 0, "slots": 0}
        tables.commit(
            ScopeCancelled(
                Rec.SCOPE_CANCELLED, scope.id, reason, tables.wall(now), scope.tenant
            ),
            now,
        )
        message = scope.cancelled_message()
        for wait in list(scope.parked):  # pool and quota waits, before slots free up
            tables.waits.end(wait, ErrorCode.SCOPE_CANCELLED, message)
        claims, tasks, slots = scope.held_claims, len(scope.live_items), len(scope.slots)
        # Its slots, parked receives, claims and tasks end (the first two at once, the
        # others in slices: cascade.py).
        tables.events.run_cancelled(now, scope)
        self.tables.effects.note(
            "run cancelled", scope=scope.id, reason=reason, tasks=tasks, claims=claims,
            slots=slots,
        )
        return {"scope": scope.id, "cancelled": True, "tasks": tasks, "claims": claims,
                "slots": slots}

    def status(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """A run's state, reason, tasks by state, claims and pool slots held. O(1)."""
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        scope = self.tables.find_scope(self.tables.tenant_of(conn), scope_id)
        if scope is None:
            raise CoreError(ErrorCode.NOT_FOUND, f"no run {scope_id!r}")
        return {
            "scope": scope.id,
            "state": "open" if scope.cancelled is None else "cancelled",
            "reason": scope.cancelled,
            "created_at": scope.created_at,
            "tasks": dict(scope.counts),
            "claims": scope.held_claims,
            "slots": len(scope.slots),
        }

    # Records (layouts in records.py) end with the tenant; older files' records are
    # brought to these layouts by upgrade.py before they get here.

    def apply_created(self, rec: ScopeCreated, now: float) -> None:
        scope = self.tables.scope_for(rec[3], rec[1])
        if scope.created_at is None:
            scope.created_at = rec[2]
        self.tables.release_scope(scope)  # made empty: quiet from now on (runends.py)

    def apply_cancelled(self, rec: ScopeCancelled, now: float) -> None:
        scope = self.tables.scope_for(rec[4], rec[1])
        if scope.cancelled is None:
            scope.cancelled = rec[2]
        self.tables.release_scope(scope)  # cancelled empty: a fresh quiet window

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        for scope in self.tables.scopes.values():
            if scope.created_at is not None or scope.cancelled is not None:
                yield scope_record(scope)

    def apply_snapshot(self, rec: SnapScope, now: float) -> None:
        _, scope_id, created_at, cancelled, tenant, since = rec
        scope = self.tables.scope_for(tenant, scope_id)
        scope.created_at = created_at
        scope.cancelled = cancelled
        if since is not None:  # quiet: what it held since, if anything, comes later
            self.run_ends.start(scope, since)
        else:
            self.tables.release_scope(scope)  # RunEnds.arm checks what it holds then

    def keep_runs_made_by_use(self, now: float) -> None:
        """After recovery: a run an older journal made by first use (no SCOPE_CREATED,
        still holding something) gets its SCOPE_CREATED record now, so it keeps existing
        once emptied, like every run made today. One walk over the runs, at start only."""
        tables = self.tables
        for scope in list(tables.scopes.values()):
            if scope.created_at is None:
                tables.commit(
                    ScopeCreated(Rec.SCOPE_CREATED, scope.id, tables.wall(now), scope.tenant), now
                )


def scope_record(scope: Scope) -> SnapScope:
    """The SNAP_SCOPE of ``scope``: a snapshot's, and a moved run's (transfer.py)."""
    return SnapScope(Rec.SNAP_SCOPE, scope.id, scope.created_at, scope.cancelled,
                     scope.tenant, scope.quiet_since)  # its last RUN_QUIET's, if any
