"""The admin ops (rsctl, the dashboard): paged listings of runs, claims, tasks, pools,
quotas, mailboxes, a run's mailboxes and groups; one task in full; and asking the shell
for a snapshot. (Dead letters: deadletters.py.)

What always holds:
- every op here is admin-only: a client-role connection gets PERMISSION_DENIED before
  anything is read (``Tenants.require_admin``);
- an op reads the caller's own tenant unless it names another in ``tenant``; a tenant
  or run that does not exist reads as empty / NOT_FOUND, like everywhere else
  (adminargs.py);
- a listing costs in proportion to its page: it resumes from its ``cursor`` in O(log n)
  and looks at no more than ``limit * Policy.ADMIN_SCAN_FACTOR`` entries (pages.py),
  with ``limit`` at most ``Policy.ADMIN_PAGE_MAX``, oldest first or, with
  ``newest_first``, newest first; the reply's ``next`` is the cursor to go on from, or
  nil once the walk is complete. Each row is O(1) to make: counts kept as objects move,
  never a walk;
- SNAPSHOT_NOW does no I/O here: it leaves the request in ``effects.snapshot_asks`` and
  the shell answers it once a snapshot started after the request has been written.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode, Limits, Op

from .ground.effects import DEFERRED
from .ground.errors import CoreError
from .ground.validate import invalid, opt_text, req_text
from .holds.claimbook import Claim
from .holds.poolbook import Pool, PoolBook
from .holds.quotabook import QuotaBook
from .run.items import STATE_BY_NAME, Item, State
from .run.links import links_admin_view
from .run.queue import Queue
from .run.scope import Scope
from .state.adminargs import admin_scope, admin_tenant, page_of
from .state.tables import Applier, Handler, Tables
from .tenant.mailbox import Mailbox
from .work.keylimits import Gate
from .work.mailboxbook import MailboxBook
from .work.workbook import Work

__all__ = ["AdminBook"]


class AdminBook:
    """The admin listings, ADMIN_TASK and SNAPSHOT_NOW. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, pools: PoolBook, quotas: QuotaBook,
        mailboxes: MailboxBook,
    ) -> None:
        self.tables = tables
        self.work = work
        self.pools = pools
        self.quotas = quotas
        self.mailboxes = mailboxes
        self.ops: dict[int, Handler] = {
            Op.ADMIN_SCOPES: self.scopes,
            Op.ADMIN_CLAIMS: self.claims,
            Op.ADMIN_TASKS: self.tasks,
            Op.ADMIN_TASK: self.task,
            Op.ADMIN_POOLS: self.pool_list,
            Op.SNAPSHOT_NOW: self.snapshot_now,
            Op.ADMIN_GROUPS: self.groups,
            Op.ADMIN_QUOTAS: self.quota_list,
            Op.ADMIN_MAILBOXES: self.mailbox_list,
            Op.ADMIN_QUEUES: self.queues,
        }
        self.appliers: dict[int, Applier] = {}

    # ---- a tenant's listings -----------------------------------------------------------

    def scopes(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_SCOPES")
        found, cursor = page_of(self.tables.scope_pages.get(tenant), args)
        return {"scopes": [_scope_view(scope) for scope in found], "next": cursor}

    def pool_list(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_POOLS")
        found, cursor = page_of(self.pools.pages.get(tenant), args)
        return {"pools": [_pool_view(pool) for pool in found], "next": cursor}

    def quota_list(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """A tenant's quotas, each as QUOTA_INSPECT reads it (its level refilled to now)."""
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_QUOTAS")
        found, cursor = page_of(self.quotas.pages.get(tenant), args)
        wall = self.tables.wall(now)
        return {"quotas": [self.quotas.view(quota, wall) for quota in found], "next": cursor}

    def mailbox_list(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """A tenant's mailbox definitions, each with its depth over all its runs."""
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_MAILBOXES")
        found, cursor = page_of(self.mailboxes.pages.get(tenant), args)
        return {"mailboxes": [_mailbox_view(box) for box in found], "next": cursor}

    # ---- a run's listings --------------------------------------------------------------

    def claims(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_CLAIMS")
        scope = admin_scope(self.tables, tenant, args)
        found, cursor = page_of(scope.claim_pages, args)
        bound = self.tables.leases.bound
        return {
            "claims": [_claim_view(claim, now, bound) for claim in found], "next": cursor
        }

    def tasks(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_TASKS")
        scope = admin_scope(self.tables, tenant, args)
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
        found, cursor = page_of(scope.item_pages, args, match)
        return {"tasks": [_item_view(item) for item in found], "next": cursor}

    def queues(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """A run's mailboxes that hold something in it, each with QUEUE_INSPECT's counts."""
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_QUEUES")
        scope = admin_scope(self.tables, tenant, args)
        found, cursor = page_of(scope.queue_pages, args)
        return {"mailboxes": [_queue_view(queue) for queue in found], "next": cursor}

    def groups(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """A run's task groups, each as GROUP_STATUS reads it."""
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_GROUPS")
        scope = admin_scope(self.tables, tenant, args)
        found, cursor = page_of(scope.group_pages, args)
        return {"groups": [group.view() for group in found], "next": cursor}

    def task(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_TASK")
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        item_id = req_text(args, "task", Limits.MAX_KEY_BYTES)
        item = self.work.items.get(item_id)
        if item is None or item.scope != scope_id or item.tenant != tenant:
            raise CoreError(ErrorCode.NOT_FOUND, f"no task {item_id!r} in scope {scope_id!r}")
        lease = item.delivery
        log = item.events  # its retained events (eventlog.py), oldest first
        events, missed = ([], 0) if log is None else log.since(0)
        return {
            **_item_view(item),
            "events": events,
            "events_missed": missed,
            "data": item.data,
            "outcome": item.outcome,
            "subscribers": sorted(item.subscribers),
            "deadline": item.deadline,
            "tombstoned": item.tombstoned,
            "links": links_admin_view(item.links, self.work.items),
            "signals": None if item.signals is None else item.signals.view(
                item.visible_at if item.state is State.WAITING else None
            ),
            # its limits by key and the key holding it back (work/keylimits.py), if any
            "limits": None if item.limits is None else item.limits.view(),
            "held_by": held_by(item),
            "delivery": None if lease is None else {
                "holder": lease.holder,
                "lease_seconds": lease.length,
                "expires_in": round(max(0.0, lease.expires_at - now), 3),
                "release_on_disconnect": lease.handle in self.tables.leases.bound,
            },
        }

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


def _mailbox_view(box: Mailbox) -> dict[str, Any]:
    return {**box.view(), "ready": box.depth.ready, "running": box.depth.running}


def _queue_view(queue: Queue) -> dict[str, Any]:
    return {"mailbox": queue.mailbox, **queue.counts()}


def held_by(item: Item) -> dict[str, Any] | None:
    """The state of the key holding ``item`` back (keylimits.py), None if none does."""
    gate = item.blocked_on
    return gate.held_view() if isinstance(gate, Gate) else None
