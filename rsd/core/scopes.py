"""Scopes (runs): the namespace every claim, task and queue lives in.

A scope is known once it is created explicitly (SCOPE_CREATE, which makes a fresh id)
or first used by id: workers attach to a run whose id they were handed, and a key
inside one scope never collides with the same key inside another. A cancelled scope
refuses new work (SCOPE_CANCELLED) but still answers reads; cancelling ends everything
the run holds or waits on, each ending its own record after the SCOPE_CANCELLED one.
The table is keyed by ``ScopeKey``, ``(tenant, scope id)``: a tenant only ever finds
its own runs, and another tenant's run of the same id is, for it, a run that does not
exist (tenants.py). A new run counts against its tenant's ``runs`` limit, whether made
by SCOPE_CREATE, by first use or by cancelling an id never used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits, Op

from .errors import CoreError
from .pages import PagedIndex
from .records import Rec
from .tenants import MAX_TENANT_BYTES
from .validate import opt_text, req_text

if TYPE_CHECKING:
    from .claims import Claim, ClaimBook
    from .deliveries import Deliveries
    from .items import Item
    from .queue import Queue
    from .tables import Applier, Handler, Tables
    from .tasks import Tasks

__all__ = ["Scope", "ScopeBook", "ScopeKey"]

ScopeKey = tuple[str, str]  # (tenant, scope id)


class Scope:
    __slots__ = (
        "cancelled", "claim_pages", "claims", "created_at", "id", "item_pages", "key",
        "live_items", "queues", "tasks", "tenant",
    )

    def __init__(self, tenant: str, scope_id: str, created_at: float | None) -> None:
        self.tenant = tenant
        self.id = scope_id
        self.key: ScopeKey = (tenant, scope_id)
        self.created_at = created_at  # wall clock of explicit creation, None if implicit
        self.cancelled: str | None = None  # the reason, once cancelled
        self.claims: dict[str, Claim] = {}
        self.tasks: dict[str, Item] = {}  # task key -> task
        self.queues: dict[str, Queue] = {}  # mailbox name -> this scope's queue
        self.live_items: dict[str, Item] = {}  # item id -> unfinished task or message
        # The admin listings' indexes (pages.py), made on first use.
        self.claim_pages: PagedIndex[Claim] | None = None
        self.item_pages: PagedIndex[Item] | None = None

    def cancelled_message(self) -> str:
        return f"run {self.id!r} was cancelled: {self.cancelled}"

    def refuse_if_cancelled(self) -> None:
        """New work in a cancelled run is SCOPE_CANCELLED: the one place of that rule."""
        if self.cancelled is not None:
            raise CoreError(ErrorCode.SCOPE_CANCELLED, self.cancelled_message())


class ScopeBook:
    """SCOPE_CREATE and SCOPE_CANCEL and their records. Owned by the Core."""

    def __init__(
        self,
        tables: Tables,
        new_scope_id: Callable[[], str],
        claims: ClaimBook,
        deliveries: Deliveries,
        tasks: Tasks,
    ) -> None:
        self.tables = tables
        self.new_scope_id = new_scope_id
        self.claims = claims
        self.deliveries = deliveries
        self.tasks = tasks
        self.ops: dict[int, Handler] = {
            Op.SCOPE_CREATE: self.create,
            Op.SCOPE_CANCEL: self.cancel,
        }
        self.appliers: dict[int, Applier] = {
            Rec.SCOPE_CREATED: self.apply_created,
            Rec.SCOPE_CANCELLED: self.apply_cancelled,
            Rec.SNAP_SCOPE: self.apply_snapshot,
        }

    def create(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tables = self.tables
        tenant = tables.tenant_of(conn)
        tables.tenants.room(tenant, "runs")
        scope_id = self.new_scope_id()
        while (tenant, scope_id) in tables.scopes:
            scope_id = self.new_scope_id()
        tables.commit((Rec.SCOPE_CREATED, scope_id, tables.wall(now), tenant), now)
        return {"scope": scope_id}

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
        scope = tables.open_scope(tenant, scope_id)
        if scope.cancelled is not None:
            return {"scope": scope.id, "cancelled": True, "tasks": 0, "claims": 0}
        tables.commit(
            (Rec.SCOPE_CANCELLED, scope.id, reason, tables.wall(now), scope.tenant), now
        )
        claims = self.claims.scope_cancelled(now, scope)
        self.deliveries.scope_cancelled(scope)
        tasks = self.tasks.scope_cancelled(now, scope)
        self.tables.effects.note(
            "run cancelled", scope=scope.id, reason=reason, tasks=tasks, claims=claims
        )
        return {"scope": scope.id, "cancelled": True, "tasks": tasks, "claims": claims}

    # Records (layouts in records.py) end with the tenant; older files' records are
    # brought to these layouts by upgrade.py before they get here.

    def apply_created(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[3], rec[1])
        if scope.created_at is None:
            scope.created_at = rec[2]

    def apply_cancelled(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[4], rec[1])
        if scope.cancelled is None:
            scope.cancelled = rec[2]

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        for scope in self.tables.scopes.values():
            if scope.created_at is not None or scope.cancelled is not None:
                yield (Rec.SNAP_SCOPE, scope.id, scope.created_at, scope.cancelled,
                       scope.tenant)

    def apply_snapshot(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[4], rec[1])
        scope.created_at = rec[2]
        scope.cancelled = rec[3]
