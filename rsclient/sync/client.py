"""``Runstate``: the sync client, for scripts and for workers of Celery, RQ or plain
threads. The same API as ``AsyncRunstate`` with plain calls and ``with`` blocks.

What always holds: one sync client is one ``AsyncRunstate`` on one event loop in one
background thread (the portal); every call from any thread runs there, so one client is
safe to share between threads and keeps one connection, one renewal timer for all its
leases, and the async client's rules, not a copy of them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from .. import client as aclient
from .. import groups as agroups
from ..connection import DEFAULT_CONNECT_TIMEOUT
from ..events import ConnectionEvent
from ..fence import FenceStatus
from ..wire import Limits
from ._portal import Portal
from .claims import Claim
from .mailboxes import Mailbox, Ticket
from .pools import Pools, Quota, Quotas

__all__ = ["Fence", "Mailboxes", "Runstate", "Scope", "Scopes", "TaskGroup"]


class Runstate:
    """The sync client. ``with Runstate(holder="w1") as rs: run = rs.scopes.create()``.

    Arguments as for ``AsyncRunstate`` (a malformed address raises InvalidArgumentError
    here); ``close()`` (or leaving the ``with`` block) releases held leases and stops the
    background thread.
    """

    def __init__(
        self,
        holder: str | None = None,
        address: str | None = None,
        token: str | None = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._async = aclient.AsyncRunstate(
            holder, address, token, connect_timeout=connect_timeout
        )
        self._portal = Portal(f"rsclient-{self._async.holder}")
        self.scopes = Scopes(self)
        self.mailboxes = Mailboxes(self)
        self.pools = Pools(self)
        self.quotas = Quotas(self)
        self.fence = Fence(self)

    def __repr__(self) -> str:
        return f"<Runstate holder={self.holder!r} address={self.address!r}>"

    @property
    def holder(self) -> str:
        """Who this client is, as the server records it."""
        return self._async.holder

    @property
    def address(self) -> str:
        """The server's ``HOST:PORT``."""
        return self._async.address

    def __enter__(self) -> Runstate:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> None:
        """Connect now rather than on first use (optional)."""
        self._portal.call(self._async.connect())

    def close(self) -> None:
        """Release every lease still held, close the connection, stop the thread.
        Idempotent; calls after it raise UnavailableError("client is closed")."""
        if self._portal.closed:
            return
        try:
            self._portal.call(self._async.close())
        finally:
            self._portal.close()

    def ping(self) -> dict[str, Any]:
        """Ask the server for its time: a round trip that changes nothing."""
        return self._portal.call(self._async.ping())

    def server_stats(self) -> dict[str, Any]:
        """The server's counters: connections, core tables, journal writes and fsyncs."""
        return self._portal.call(self._async.server_stats())

    def on_connection_event(
        self, callback: Callable[[ConnectionEvent], object]
    ) -> Callable[[], None]:
        """Call ``callback(event)`` on every connection event. It runs on the client's
        loop thread: keep it short, and make no calls on this client from it."""
        return self._async.on_connection_event(callback)

    def scope(self, scope_id: str) -> Scope:
        """The run ``scope_id`` (made by ``scopes.create()``, maybe in another process)."""
        return Scope(self._portal, self._async.scope(scope_id))


class Scopes:
    """``rs.scopes``: making new runs."""

    def __init__(self, client: Runstate) -> None:
        self._client = client

    def create(self, id: str | None = None) -> Scope:
        """A new run with a fresh id (``scope.id``), to hand to other processes; or,
        with ``id``, the run of that chosen id, made if it does not exist yet
        (idempotent; ``scope.created`` says whether this call made it)."""
        client = self._client
        return Scope(client._portal, client._portal.call(client._async.scopes.create(id)))

    def cancel(self, scope_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run ``scope_id``, as ``rs.scope(scope_id).cancel(reason)``."""
        client = self._client
        return client._portal.call(client._async.scopes.cancel(scope_id, reason))


class Fence:
    """``rs.fence``: whether a fencing token is still its key's current grant."""

    def __init__(self, client: Runstate) -> None:
        self._client = client

    def check(self, scope: Scope | str, key: str, token: str | bytes) -> bool:
        """True while ``token`` (``lease.token()``) is the current grant of ``key`` in
        run ``scope``; False for good once its lease ended (released, expired, run
        cancelled). A run never created is NotFoundError."""
        client = self._client
        scope_id = scope if isinstance(scope, str) else scope.id
        return client._portal.call(client._async.fence.check(scope_id, key, token))

    def status(self, scope: Scope | str, key: str, token: str | bytes) -> FenceStatus:
        """``{"current": bool, "generation": int}``: as ``check``, with the key's
        generation now."""
        client = self._client
        scope_id = scope if isinstance(scope, str) else scope.id
        return client._portal.call(client._async.fence.status(scope_id, key, token))


class Mailboxes:
    """``rs.mailboxes``: defining work queues."""

    def __init__(self, client: Runstate) -> None:
        self._client = client

    def ensure(self, name: str, mode: str = "WORK", **settings: Any) -> dict[str, Any]:
        """Create the mailbox, or bring its settings (``max_attempts``,
        ``retry_backoff_ms``) to these values. Idempotent."""
        client = self._client
        return client._portal.call(client._async.mailboxes.ensure(name, mode, **settings))


class Scope:
    """A run, for sync code: claims, mailboxes and tasks inside it."""

    def __init__(self, portal: Portal, scope: aclient.Scope) -> None:
        self._portal = portal
        self._scope = scope

    def __repr__(self) -> str:
        return f"<sync Scope {self.id}>"

    @property
    def id(self) -> str:
        """The run's id."""
        return self._scope.id

    @property
    def created(self) -> bool | None:
        """Whether ``scopes.create`` made this run (None for ``rs.scope(id)``)."""
        return self._scope.created

    def claim(self, key: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS) -> Claim:
        """The claim on ``key`` in this run (no I/O until it is used)."""
        return Claim(self._portal, self._scope.claim(key, lease_seconds))

    def pool(self, name: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS) -> Claim:
        """A slot of the pool ``name`` for this run, held like a claim (the sync
        ``Claim`` API: ``acquire``, ``try_acquire``, ``run``, ``with``)."""
        return Claim(self._portal, self._scope.pool(name, lease_seconds))

    def quota(self, name: str) -> Quota:
        """The quota ``name``, taken from by this run."""
        return Quota(self._portal, self._scope.quota(name))

    def mailbox(self, name: str) -> Mailbox:
        """The mailbox ``name`` inside this run."""
        return Mailbox(self._portal, self._scope.mailbox(name))

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id (from any process); nothing is re-run."""
        return Ticket(self._portal, self._scope.task(task_id))

    def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run: its tasks end CANCELLED, its claims and waits end."""
        return self._portal.call(self._scope.cancel(reason))

    def status(self) -> dict[str, Any]:
        """The run as the server counts it now: state, reason, tasks by state, claims
        and pool slots held."""
        return self._portal.call(self._scope.status())

    def group(self, name: str) -> TaskGroup:
        """The task group ``name`` of this run (tasks join it by ``submit(group=name)``)."""
        return TaskGroup(self._portal, self._scope.group(name))


class TaskGroup:
    """A run's task group: ``wait()`` until enough of its tasks succeeded, ``status()``."""

    def __init__(self, portal: Portal, group: agroups.TaskGroup) -> None:
        self._portal = portal
        self._group = group

    def __repr__(self) -> str:
        return repr(self._group)

    @property
    def name(self) -> str:
        """The group's name within its run."""
        return self._group.name

    def status(self) -> agroups.GroupStatus:
        """The group's tasks counted by state."""
        return self._portal.call(self._group.status())

    def wait(
        self,
        need: int | None = None,
        *,
        cancel_rest: bool = False,
        timeout_ms: int | None = None,
        outcomes: bool = True,
    ) -> agroups.GroupWaitResult:
        """As the async ``TaskGroup.wait``: blocks until ``need`` tasks succeeded, or
        returns at once with ``reached`` False when that can no longer happen."""
        return self._portal.call(self._group.wait(
            need, cancel_rest=cancel_rest, timeout_ms=timeout_ms, outcomes=outcomes
        ))
