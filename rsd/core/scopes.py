"""Scopes (runs): the namespace every claim, task and queue lives in.

A scope is known once it is created explicitly (SCOPE_CREATE, which makes a fresh id)
or first used by id: workers attach to a run whose id they were handed, and a key
inside one scope never collides with the same key inside another. A cancelled scope
refuses new work (SCOPE_CANCELLED) but still answers reads; cancelling ends everything
the run holds or waits on, each ending its own record after the SCOPE_CANCELLED one.
The table is keyed by ``ScopeKey`` so a tenant can be added to the key without
reshaping anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits, Op

from .errors import CoreError
from .records import Rec
from .validate import opt_text, req_text

if TYPE_CHECKING:
    from .claims import Claim, ClaimBook
    from .deliveries import Deliveries
    from .items import Item
    from .queue import Queue
    from .tables import Applier, Handler, Tables
    from .tasks import Tasks

__all__ = ["Scope", "ScopeBook", "ScopeKey"]

ScopeKey = str


class Scope:
    __slots__ = ("cancelled", "claims", "created_at", "id", "live_items", "queues", "tasks")

    def __init__(self, scope_id: str, created_at: float | None) -> None:
        self.id = scope_id
        self.created_at = created_at  # wall clock of explicit creation, None if implicit
        self.cancelled: str | None = None  # the reason, once cancelled
        self.claims: dict[str, Claim] = {}
        self.tasks: dict[str, Item] = {}  # task key -> task
        self.queues: dict[str, Queue] = {}  # mailbox name -> this scope's queue
        self.live_items: dict[str, Item] = {}  # item id -> unfinished task or message

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
        scopes = self.tables.scopes
        scope_id = self.new_scope_id()
        while scope_id in scopes:
            scope_id = self.new_scope_id()
        self.tables.commit((Rec.SCOPE_CREATED, scope_id, self.tables.wall(now)), now)
        return {"scope": scope_id}

    def cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Cancel a run: refuse new work in it and end everything it holds or waits on."""
        scope = self.tables.scope_for(req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES))
        reason = opt_text(args, "reason", Limits.MAX_REASON_BYTES) or "cancelled"
        if scope.cancelled is not None:
            return {"scope": scope.id, "cancelled": True, "tasks": 0, "claims": 0}
        self.tables.commit((Rec.SCOPE_CANCELLED, scope.id, reason, self.tables.wall(now)), now)
        claims = self.claims.scope_cancelled(now, scope)
        self.deliveries.scope_cancelled(scope)
        tasks = self.tasks.scope_cancelled(now, scope)
        self.tables.effects.note(
            "run cancelled", scope=scope.id, reason=reason, tasks=tasks, claims=claims
        )
        return {"scope": scope.id, "cancelled": True, "tasks": tasks, "claims": claims}

    def apply_created(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[1])
        if scope.created_at is None:
            scope.created_at = rec[2]

    def apply_cancelled(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[1])
        if scope.cancelled is None:
            scope.cancelled = rec[2]

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        for scope in self.tables.scopes.values():
            if scope.created_at is not None or scope.cancelled is not None:
                yield (Rec.SNAP_SCOPE, scope.id, scope.created_at, scope.cancelled)

    def apply_snapshot(self, rec: tuple[Any, ...], now: float) -> None:
        scope = self.tables.scope_for(rec[1])
        scope.created_at = rec[2]
        scope.cancelled = rec[3]
