"""The admin calls (``rs.admin``): what ``rsctl`` shows, for scripts in Python.

Every call needs a token with the admin role (else ``PermissionDeniedError``, code
PERMISSION_DENIED). Listings are paged on the server: ``page()`` returns one page and
the cursor to go on from (None when done); ``iter_*`` walks every page, ``limit``
objects to a page (1 to 1000; the server's default 100). ``tenant`` names another tenant
(default: the token's own).

Of a sharded cluster (the client routes: ``shards.py``) the calls cover every shard:
a call that names a run (``scope``: a run's claims, tasks, groups, queues, dead letters,
one task) goes to the run's shard, each object it lists naming that shard (``shard``);
a listing that names none (runs, pools, quotas, mailboxes) is asked of every shard that
owns slots and merged, its cursor a string that carries each shard's position, and
``stats()`` gives every shard's SERVER_STATS and their counters summed (the rules are
rsproto/fanout.py's, which the dashboard follows too).
A server alone, or a cluster of one shard, answers as it always did: one request, the
objects and cursor as the server gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from rsproto.fanout import (
    PAGE_DEFAULT,
    PAGE_MAX,
    CursorError,
    merge_page,
    merge_stats,
    plan_page,
    read_cursor,
)
from rsproto.sdkrules import Route, route_key

from .errors import InvalidArgumentError
from .wire import Op

if TYPE_CHECKING:
    from .session import Session
    from .shards import Shards

__all__ = ["Admin"]

Cursor = int | str  # a lone rsd's integer; a sharded cluster's merged listing's string


class Admin:
    """``rs.admin``: the admin-only calls rsctl makes (an admin token's connection;
    PermissionDeniedError otherwise). Listings are paged by the server and walked here,
    ``limit`` objects to a page; of a sharded cluster, every shard's (the module
    docstring)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def _router(self) -> Shards | None:
        """The client's router if it routes, else None; connected first if need be (the
        first HELLO tells whether the cluster is sharded)."""
        session = self._session
        if session.router is None:
            await session.connect()
        return session.router

    async def _session_for(self, op: int, sent: dict[str, Any]) -> Session:
        """Where ``op`` goes: the run's shard for an op that names a run but that the
        route table sends to any connection (the admin ops: ``sdkrules.ROUTE``), else
        the client's own session (which routes by that table)."""
        scope = sent.get("scope")
        if (isinstance(scope, str) and route_key(op, sent)[0] is Route.ANY
                and await self._router() is not None):
            return self._session.for_run(scope)
        return self._session

    async def request(self, op: int, **args: Any) -> dict[str, Any]:
        """One admin request (to the run's shard if it names a run); arguments that are
        None are left out. Reads lost with their connection are sent again
        (``failover.py``)."""
        sent = {k: v for k, v in args.items() if v is not None}
        session = await self._session_for(op, sent)
        return cast("dict[str, Any]", await session.call(op, sent))

    async def page(
        self, op: int, field: str, *, cursor: Cursor = 0, limit: int | None = None,
        **args: Any,
    ) -> tuple[list[dict[str, Any]], Cursor | None]:
        """One page of a listing op: its objects (reply field ``field``) and the cursor
        to go on from, or None once the listing is complete. Of a sharded cluster, a
        listing that names no run is every shard's, merged (the module docstring)."""
        router = await self._router()
        if router is None or isinstance(args.get("scope"), str):
            reply = await self.request(op, cursor=cursor, limit=limit, **args)
            found: list[dict[str, Any]] = reply[field]
            if router is not None:
                shard = self._session.for_run(args["scope"]).shard
                for obj in found:
                    obj["shard"] = shard
            return found, reply["next"]
        return await self._merged(router, op, field, cursor, limit, args)

    async def _merged(
        self, router: Shards, op: int, field: str, cursor: Cursor, limit: int | None,
        args: dict[str, Any],
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One merged page of every shard that owns slots (rsproto/fanout.py)."""
        try:
            positions = read_cursor(cursor)
        except CursorError as exc:
            raise InvalidArgumentError(str(exc)) from None
        size = PAGE_DEFAULT if limit is None else limit
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= PAGE_MAX:
            raise InvalidArgumentError(f"limit must be an integer from 1 to {PAGE_MAX}")
        sessions = dict(router.owning())
        sent = {k: v for k, v in args.items() if v is not None}
        asks = plan_page(positions, sessions, size)
        answers = await asyncio.gather(*(
            sessions[name].call(op, {**sent, "cursor": at, "limit": share})
            for name, at, share in asks
        ), return_exceptions=True)
        replies: dict[str, dict[str, Any]] = {}
        for (name, _, _), answer in zip(asks, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer
            replies[name] = answer
        return merge_page(positions, sessions, asks, replies, field)

    async def iterate(
        self, op: int, field: str, *, limit: int | None = None, **args: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Every object of a listing, page after page."""
        cursor: Cursor | None = 0
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
        """The server's counters (SERVER_STATS). Of a sharded cluster, every shard's
        primary's under ``shards`` (shard -> its counters), and the counters of
        ``rsproto.fanout.SUMMED`` (connections, requests, errors, leases held, tasks and messages
        by state, the ``core`` tables, ...) added up over the shards."""
        router = await self._router()
        if router is None:
            return await self.request(Op.SERVER_STATS)
        owners = router.owning()
        answers = await asyncio.gather(
            *(session.call(Op.SERVER_STATS, {}) for _, session in owners),
            return_exceptions=True,
        )
        each: dict[str, dict[str, Any]] = {}
        for (name, _), answer in zip(owners, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer
            each[name] = answer
        return merge_stats(each)
