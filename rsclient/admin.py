"""The admin calls (``rs.admin``): what ``rsctl`` shows, for scripts in Python.

Every call needs a token with the admin role (else ``PermissionDeniedError``, code
PERMISSION_DENIED). Listings are paged on the server: ``page()`` returns one page and
the cursor to go on from (None when done); ``iter_*`` walks every page, ``limit``
objects to a page (1 to 1000; the server's default 100). ``tenant`` names another tenant
(default: the token's own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from .errors import UnavailableError
from .wire import Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Admin"]


class Admin:
    """``rs.admin``: the admin-only calls rsctl makes (an admin token's connection;
    PermissionDeniedError otherwise). Listings are paged by the server and walked here,
    ``limit`` objects to a page."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def request(self, op: int, **args: Any) -> dict[str, Any]:
        """One admin request; arguments that are None are left out."""
        sent = {k: v for k, v in args.items() if v is not None}
        try:
            reply = await self._session.request(op, sent)
        except UnavailableError as exc:  # reads sent again (``failover.py``)
            reply = await self._session.again(exc, op, sent)
        return cast("dict[str, Any]", reply)

    async def page(
        self, op: int, field: str, *, cursor: int = 0, limit: int | None = None, **args: Any
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One page of a listing op: its objects (reply field ``field``) and the cursor
        to go on from, or None once the listing is complete."""
        reply = await self.request(op, cursor=cursor, limit=limit, **args)
        return reply[field], reply["next"]

    async def iterate(
        self, op: int, field: str, *, limit: int | None = None, **args: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Every object of a listing, page after page."""
        cursor: int | None = 0
        while cursor is not None:
            found, cursor = await self.page(op, field, cursor=cursor, limit=limit, **args)
            for obj in found:
                yield obj

    def iter_scopes(
        self, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every run of the tenant (the caller's, or ``tenant``), oldest first."""
        return self.iterate(Op.ADMIN_SCOPES, "scopes", limit=limit, tenant=tenant)

    def iter_claims(
        self, scope: str, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every claim of run ``scope``, in the order they were first made."""
        return self.iterate(Op.ADMIN_CLAIMS, "claims", limit=limit, scope=scope, tenant=tenant)

    def iter_tasks(
        self, scope: str, *, state: str | None = None, mailbox: str | None = None,
        tenant: str | None = None, limit: int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every task and message of run ``scope``, optionally of one state or mailbox."""
        return self.iterate(
            Op.ADMIN_TASKS, "tasks", limit=limit, scope=scope, state=state, mailbox=mailbox,
            tenant=tenant,
        )

    def iter_pools(
        self, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every pool of the tenant, in the order they were defined."""
        return self.iterate(Op.ADMIN_POOLS, "pools", limit=limit, tenant=tenant)

    def iter_quotas(
        self, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every quota of the tenant, in the order they were defined, each as
        ``inspect()`` reads it (``level`` refilled to now)."""
        return self.iterate(Op.ADMIN_QUOTAS, "quotas", limit=limit, tenant=tenant)

    def iter_mailboxes(
        self, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every mailbox of the tenant, in the order they were defined, with its
        settings and its depth over all runs (``ready``, ``running``)."""
        return self.iterate(Op.ADMIN_MAILBOXES, "mailboxes", limit=limit, tenant=tenant)

    def iter_queues(
        self, scope: str, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The mailboxes that hold something in run ``scope`` (the scope's ``queues``),
        each with ``inspect()``'s counts in that run: ``{"mailbox", "ready",
        "running", "delayed", "consumers", "dead_letters"}``."""
        return self.iterate(Op.ADMIN_QUEUES, "mailboxes", limit=limit, scope=scope, tenant=tenant)

    def iter_groups(
        self, scope: str, tenant: str | None = None, *, limit: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every task group of run ``scope`` the server knows, in the order they were
        first used, each as ``group.status()`` reads it."""
        return self.iterate(Op.ADMIN_GROUPS, "groups", limit=limit, scope=scope, tenant=tenant)

    async def task(self, scope: str, task_id: str, tenant: str | None = None) -> dict[str, Any]:
        """One task or message in full: its data, outcome and current delivery."""
        return await self.request(Op.ADMIN_TASK, scope=scope, task=task_id, tenant=tenant)

    async def dead_letters(
        self, scope: str, mailbox: str, limit: int = 1000, tenant: str | None = None
    ) -> dict[str, Any]:
        """A mailbox's newest dead letters in a run, newest last, as many as fit in one
        reply: ``{"items", "truncated", "count"}`` (``count``: all there are)."""
        return await self.request(
            Op.ADMIN_DEAD_LETTERS, scope=scope, mailbox=mailbox, limit=limit, tenant=tenant
        )

    async def requeue(
        self, scope: str, mailbox: str, *, dead_id: str | None = None, all: bool = False,
        limit: int | None = None, tenant: str | None = None,
    ) -> dict[str, Any]:
        """Put one dead letter (``dead_id``) or the oldest ``limit`` (``all=True``) back on
        the queue as new items: ``{"requeued": [{"id", "new"}], "left": n}``."""
        return await self.request(
            Op.DEAD_LETTER_REQUEUE, scope=scope, mailbox=mailbox, id=dead_id,
            all=True if all else None, limit=limit, tenant=tenant,
        )

    async def delete_dead_letter(
        self, scope: str, mailbox: str, dead_id: str, tenant: str | None = None
    ) -> dict[str, Any]:
        """Delete one dead letter for good: ``{"deleted": dead_id, "left": n}``.
        NotFoundError if it is not on the list, a second delete of it included (a delete
        whose reply was lost is not sent again: UnavailableError, ``failover.py``)."""
        return await self.request(
            Op.DEAD_LETTER_DELETE, scope=scope, mailbox=mailbox, id=dead_id, tenant=tenant
        )

    async def cancel(
        self, scope: str, reason: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """Cancel a run (another tenant's with ``tenant``)."""
        return await self.request(Op.SCOPE_CANCEL, scope=scope, reason=reason, tenant=tenant)

    async def snapshot(self) -> dict[str, Any]:
        """Force a snapshot; returns once it is written: ``{"snapshot", "covers"}``."""
        return await self.request(Op.SNAPSHOT_NOW)

    async def stats(self) -> dict[str, Any]:
        """The server's counters (SERVER_STATS)."""
        return await self.request(Op.SERVER_STATS)
