"""``Runstate``: the sync client, for scripts and for workers of Celery, RQ or plain
threads. The same API as ``AsyncRunstate`` with plain calls and ``with`` blocks.

What always holds: one sync client is one ``AsyncRunstate`` on one event loop in one
background thread (the portal); every call from any thread runs there, so one client is
safe to share between threads and keeps one connection, one renewal timer for all its
leases, and the async client's rules, not a copy of them. Its arguments and every method
that only mirrors an async one are derived from the async client (``_derive.py``).
"""

from __future__ import annotations

from types import TracebackType

from .. import client as aclient
from .. import fence as afence
from .. import groups as agroups
from .. import mailboxes as amailboxes
from ._derive import Handle, blocking, construct, direct
from ._portal import Portal
from .claims import Claim
from .mailboxes import Mailbox, Ticket
from .pools import Pools, Quota, Quotas
from .schedules import Schedules

__all__ = ["Fence", "Mailboxes", "Runstate", "Scope", "Scopes", "TaskGroup"]


class TaskGroup(Handle[agroups.TaskGroup]):
    """A run's task group: ``wait()`` until enough of its tasks succeeded, ``status()``."""

    def __repr__(self) -> str:
        return repr(self._async)

    @property
    def name(self) -> str:
        """The group's name within its run."""
        return self._async.name

    status = blocking(agroups.TaskGroup.status)
    wait = blocking(agroups.TaskGroup.wait)


class Scope(Handle[aclient.Scope]):
    """A run, for sync code: claims, mailboxes and tasks inside it."""

    def __repr__(self) -> str:
        return f"<sync Scope {self.id}>"

    @property
    def id(self) -> str:
        """The run's id."""
        return self._async.id

    @property
    def created(self) -> bool | None:
        """Whether ``scopes.create`` made this run (None for ``rs.scope(id)``)."""
        return self._async.created

    @property
    def schedules(self) -> Schedules:
        """The run's schedules: ``ensure``, ``list``, ``get``, ``pause``, ``resume``,
        ``delete`` (rsclient.schedules)."""
        return Schedules(self._portal, self._async.schedules)

    claim = direct(aclient.Scope.claim, Claim)
    pool = direct(aclient.Scope.pool, Claim, note="""
        The sync ``Claim`` API: ``acquire``, ``try_acquire``, ``run``, ``with``.""")
    quota = direct(aclient.Scope.quota, Quota)
    mailbox = direct(aclient.Scope.mailbox, Mailbox)
    task = direct(aclient.Scope.task, Ticket)
    group = direct(aclient.Scope.group, TaskGroup)
    cancel = blocking(aclient.Scope.cancel)
    status = blocking(aclient.Scope.status)


class Scopes(Handle[aclient.Scopes]):
    """``rs.scopes``: making new runs."""

    create = blocking(aclient.Scopes.create, Scope)
    cancel = blocking(aclient.Scopes.cancel)


class Fence(Handle[afence.Fence]):
    """``rs.fence``: whether a fencing token is still its key's current grant."""

    check = blocking(afence.Fence.check)
    status = blocking(afence.Fence.status)


class Mailboxes(Handle[amailboxes.Mailboxes]):
    """``rs.mailboxes``: defining work queues."""

    ensure = blocking(amailboxes.Mailboxes.ensure)
    pause = blocking(amailboxes.Mailboxes.pause)
    resume = blocking(amailboxes.Mailboxes.resume)


class Runstate(Handle[aclient.AsyncRunstate]):
    """The sync client. ``with Runstate(holder="w1") as rs: run = rs.scopes.create()``.

    Arguments as for ``AsyncRunstate`` (a malformed address raises InvalidArgumentError
    here); ``close()`` (or leaving the ``with`` block) releases held leases and stops the
    background thread.
    """

    @construct(aclient.AsyncRunstate)
    def __init__(self, client: aclient.AsyncRunstate) -> None:
        super().__init__(Portal(f"rsclient-{client.holder}"), client)
        portal = self._portal
        self.scopes = Scopes(portal, client.scopes)
        self.mailboxes = Mailboxes(portal, client.mailboxes)
        self.pools = Pools(portal, client.pools)
        self.quotas = Quotas(portal, client.quotas)
        self.fence = Fence(portal, client.fence)

    def __repr__(self) -> str:
        return f"<Runstate holder={self.holder!r} address={self.address!r}>"

    @property
    def holder(self) -> str:
        """Who this client is, as the server records it."""
        return self._async.holder

    @property
    def address(self) -> str:
        """The address given: ``HOST:PORT``, or a cluster's nodes as a comma-separated
        list."""
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

    connect = blocking(aclient.AsyncRunstate.connect)
    ping = blocking(aclient.AsyncRunstate.ping)
    server_stats = blocking(aclient.AsyncRunstate.server_stats)
    on_connection_event = direct(aclient.AsyncRunstate.on_connection_event, note="""
        In the sync client it runs on the client's loop thread: keep it short, and make
        no calls on this client from it.""")
    scope = direct(aclient.AsyncRunstate.scope, Scope)

    def close(self) -> None:
        """Release every lease still held, close the connection, stop the thread.
        Idempotent; calls after it raise UnavailableError("client is closed")."""
        if self._portal.closed:
            return
        try:
            self._portal.call(self._async.close())
        finally:
            self._portal.close()
