"""The admin ops (rsctl): paged listings of runs, claims, tasks and pools, one task in
full, requeueing dead letters, and asking the shell for a snapshot.

What always holds:
- every op here is admin-only: a client-role connection gets PERMISSION_DENIED before
  anything is read (``Tenants.require_admin``);
- an op reads the caller's own tenant unless it names another in ``tenant``; a tenant
  or run that does not exist reads as empty / NOT_FOUND, like everywhere else;
- a listing costs in proportion to its page: it resumes from its ``cursor`` in O(log n)
  and looks at no more than ``limit * Policy.ADMIN_SCAN_FACTOR`` entries (pages.py),
  with ``limit`` at most ``Policy.ADMIN_PAGE_MAX``; the reply's ``next`` is the cursor to
  go on from, or nil once the walk is complete;
- a requeue is records: the new item's ITEM_ENQUEUED, then DEAD_LETTER_REQUEUED taking
  the entry off its list, so recovery rebuilds exactly what the live server did; one
  request requeues at most ``limit`` dead letters;
- SNAPSHOT_NOW does no I/O here: it leaves the request in ``effects.snapshot_asks`` and
  the shell answers it once a snapshot started after the request has been written.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..policy import Policy
from .claimbook import Claim
from .deliveries import Deliveries
from .effects import DEFERRED
from .errors import CoreError
from .itemrecords import DeadLetterRequeued, ItemEnqueued
from .items import STATE_BY_NAME, Item
from .pages import PagedIndex
from .payloads import checked_payload
from .poolbook import Pool, PoolBook
from .records import Rec
from .scope import Scope
from .tables import Applier, Handler, Tables
from .tenants import MAX_TENANT_BYTES
from .validate import invalid, opt_bool, opt_number, opt_text, req_text
from .work import Work

__all__ = ["AdminBook"]

_MAX_CURSOR = 2**62


class AdminBook:
    """Ops 80-87 and the DEAD_LETTER_REQUEUED record. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, pools: PoolBook
    ) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.pools = pools
        self.ops: dict[int, Handler] = {
            Op.ADMIN_SCOPES: self.scopes,
            Op.ADMIN_CLAIMS: self.claims,
            Op.ADMIN_TASKS: self.tasks,
            Op.ADMIN_TASK: self.task,
            Op.ADMIN_POOLS: self.pool_list,
            Op.DEAD_LETTER_REQUEUE: self.requeue,
            Op.SNAPSHOT_NOW: self.snapshot_now,
            Op.ADMIN_DEAD_LETTERS: self.dead_letters,
        }
        self.appliers: dict[int, Applier] = {
            Rec.DEAD_LETTER_REQUEUED: self.apply_requeued,
        }

    # ---- the arguments every admin op shares -----------------------------------------

    def _tenant(self, conn: int, args: dict[str, Any], what: str) -> str:
        """Admin only; the tenant named (an admin may name any), else the caller's."""
        self.tables.tenants.require_admin(conn, what)
        tenant = opt_text(args, "tenant", MAX_TENANT_BYTES)
        return tenant if tenant is not None else self.tables.tenant_of(conn)

    def _scope(self, tenant: str, args: dict[str, Any]) -> Scope:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        scope = self.tables.find_scope(tenant, scope_id)
        if scope is None:
            raise CoreError(ErrorCode.NOT_FOUND, f"no run {scope_id!r}")
        return scope

    @staticmethod
    def _page(
        pages: PagedIndex[Any] | None, args: dict[str, Any], match: Any = None
    ) -> tuple[list[Any], int | None]:
        cursor = int(opt_number(args, "cursor", 0, 0, _MAX_CURSOR))
        limit = int(opt_number(args, "limit", Policy.ADMIN_PAGE_DEFAULT, 1,
                               Policy.ADMIN_PAGE_MAX))
        if pages is None:
            return [], None
        return pages.page(cursor, limit, limit * Policy.ADMIN_SCAN_FACTOR, match)

    # ---- listings ----------------------------------------------------------------------

    def scopes(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self._tenant(conn, args, "ADMIN_SCOPES")
        found, cursor = self._page(self.tables.scope_pages.get(tenant), args)
        return {"scopes": [_scope_view(scope) for scope in found], "next": cursor}

    def claims(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self._tenant(conn, args, "ADMIN_CLAIMS")
        scope = self._scope(tenant, args)
        found, cursor = self._page(scope.claim_pages, args)
        bound = self.tables.leases.bound
        return {
            "claims": [_claim_view(claim, now, bound) for claim in found], "next": cursor
        }

    def tasks(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self._tenant(conn, args, "ADMIN_TASKS")
        scope = self._scope(tenant, args)
        state_name = opt_text(args, "state", 16)
        state = STATE_BY_NAME.get(state_name) if state_name is not None else None
        if state_name is not None and state is None:
            raise invalid(f"state must be one of {', '.join(STATE_BY_NAME)}, got {state_name!r}")
        mailbox = opt_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        match = None
        if state is not None or mailbox is not None:
            def match(item: Item) -> bool:
                return (state is None or item.state is state) and (
                    mailbox is None or item.mailbox == mailbox
                )
        found, cursor = self._page(scope.item_pages, args, match)
        return {"tasks": [_item_view(item) for item in found], "next": cursor}

    def task(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self._tenant(conn, args, "ADMIN_TASK")
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        item_id = req_text(args, "task", Limits.MAX_KEY_BYTES)
        item = self.work.items.get(item_id)
        if item is None or item.scope != scope_id or item.tenant != tenant:
            raise CoreError(ErrorCode.NOT_FOUND, f"no task {item_id!r} in scope {scope_id!r}")
        lease = item.delivery
        return {
            **_item_view(item),
            "data": item.data,
            "outcome": item.outcome,
            "subscribers": sorted(item.subscribers),
            "deadline": item.deadline,
            "tombstoned": item.tombstoned,
            "delivery": None if lease is None else {
                "holder": lease.holder,
                "lease_seconds": lease.length,
                "expires_in": round(max(0.0, lease.expires_at - now), 3),
                "release_on_disconnect": lease.handle in self.tables.leases.bound,
            },
        }

    def pool_list(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self._tenant(conn, args, "ADMIN_POOLS")
        found, cursor = self._page(self.pools.pages.get(tenant), args)
        return {"pools": [_pool_view(pool) for pool in found], "next": cursor}

    # ---- dead letters ------------------------------------------------------------------

    def dead_letters(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """DEAD_LETTERS for an admin, in any tenant's run: the same bounded reply."""
        tenant = self._tenant(conn, args, "ADMIN_DEAD_LETTERS")
        scope = self._scope(tenant, args)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        queue = scope.queues.get(name)
        if queue is None:
            return {"items": [], "truncated": False, "count": 0}
        return {**self.work.dead_letter_page(queue, args), "count": len(queue.dead_letters)}

    def requeue(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Put dead letters back on their queue as new items (one named by ``id``, or the
        oldest ``limit`` with ``all``); each leaves the dead-letter list."""
        tenant = self._tenant(conn, args, "DEAD_LETTER_REQUEUE")
        scope = self._scope(tenant, args)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        dead_id = opt_text(args, "id", Limits.MAX_KEY_BYTES)
        every = opt_bool(args, "all", False)
        if (dead_id is None) == (not every):
            raise invalid("name exactly one of id (one dead letter) or all: true")
        limit = int(opt_number(args, "limit", Policy.ADMIN_PAGE_DEFAULT, 1,
                               Policy.ADMIN_PAGE_MAX))
        scope.refuse_if_cancelled()
        queue = scope.queues.get(name)
        entries = list(queue.dead_letters) if queue is not None else []
        if dead_id is not None:
            entries = [entry for entry in entries if entry["id"] == dead_id]
            if not entries:
                raise CoreError(
                    ErrorCode.NOT_FOUND, f"no dead letter {dead_id!r} in mailbox {name!r}"
                )
        entries = entries[:limit]
        self.tables.tenants.room(tenant, "items", len(entries))
        requeued = []
        for entry in entries:
            new_id = self._enqueue_again(now, scope, name, entry)
            self.tables.commit(
                DeadLetterRequeued(
                    Rec.DEAD_LETTER_REQUEUED, scope.id, name, entry["id"], new_id, tenant
                ),
                now,
            )
            requeued.append({"id": entry["id"], "new": new_id})
        queue = scope.queues.get(name)
        if queue is not None:
            self.deliveries.dispatch(now, queue)
        left = len(queue.dead_letters) if queue is not None else 0
        return {"requeued": requeued, "left": left}

    def _enqueue_again(self, now: float, scope: Scope, name: str, entry: dict[str, Any]) -> str:
        """The ITEM_ENQUEUED of a dead letter's new item: same kind and data, attempt 1.
        A task keeps its key unless another task has taken it since (then it has none);
        a message loses its work_key (it would be deduplicated against itself)."""
        is_message = entry["kind"] == "message"
        data = entry["data"]
        key = None
        digest = None
        if not is_message:
            digest = checked_payload("data", data, salt=name)
            holder = scope.tasks.get(entry["key"]) if entry["key"] is not None else None
            if entry["key"] is not None and (holder is None or holder.id == entry["id"]):
                key = entry["key"]
        new_id = self.work.new_id("m" if is_message else "t", scope.tenant)
        self.tables.commit(
            ItemEnqueued(Rec.ITEM_ENQUEUED, new_id, is_message, scope.id, name, key, digest, data,
             self.tables.wall(now), None, scope.tenant),
            now,
        )
        return new_id

    def apply_requeued(self, rec: DeadLetterRequeued, now: float) -> None:
        _, scope_id, mailbox, dead_id, _new_id, tenant = rec
        queue = self.work.find_queue(tenant, scope_id, mailbox)
        if queue is None or dead_id not in queue.dead_ids:
            return  # replayed again: already off the list
        self.tables.tenants.charge(tenant, -queue.dead_ids.pop(dead_id))
        for entry in queue.dead_letters:  # at most Limits.MAX_DEAD_LETTERS entries
            if entry["id"] == dead_id:
                queue.dead_letters.remove(entry)
                break
        self.work.release(tenant, scope_id, mailbox)

    # ---- snapshots ---------------------------------------------------------------------

    def snapshot_now(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        self.tables.tenants.require_admin(conn, "SNAPSHOT_NOW")
        self.tables.effects.snapshot_asks.append((conn, rid))
        return DEFERRED


def _scope_view(scope: Scope) -> dict[str, Any]:
    return {
        "scope": scope.id,
        "created_at": scope.created_at,
        "cancelled": scope.cancelled,
        "claims": len(scope.claims),
        "tasks": len(scope.tasks),
        "unfinished": len(scope.live_items),
        "queues": len(scope.queues),
    }


def _claim_view(claim: Claim, now: float, bound: dict[bytes, int]) -> dict[str, Any]:
    """``bound``: the lease table's leases that end with their connection."""
    lease = claim.lease
    return {
        "key": claim.key,
        "generation": claim.generation,
        "held": lease is not None,
        "holder": None if lease is None else lease.holder,
        "lease_seconds": None if lease is None else lease.length,
        "expires_in": None if lease is None else round(max(0.0, lease.expires_at - now), 3),
        "release_on_disconnect": lease is not None and lease.handle in bound,
        "waiters": len(claim.waiters),
    }


def _item_view(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "kind": "message" if item.is_message else "task",
        "mailbox": item.mailbox,
        "key": item.key,
        "state": item.state.value,
        "attempt": item.attempt,
        "reason": item.reason,
        "dead": item.dead,
        "created_at": item.created_at,
        "finished_at": item.finished_at,
    }


def _pool_view(pool: Pool) -> dict[str, Any]:
    return {
        "name": pool.name,
        "size": pool.size,
        "held": len(pool.holders),
        "waiters": len(pool.waiters),
        "generation": pool.generation,
    }
