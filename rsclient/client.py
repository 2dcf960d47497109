"""``AsyncRunstate``: the client object, and the scope (run) handles it gives out.

One client holds one persistent connection (opened on first use), one lease keeper and
the session that lends both to its handles; of a sharded cluster, one connection (and
keeper) per shard primary, each request sent to the shard that owns it (``shards.py``).
Constructing it does no I/O, so it can be built outside a running event loop; a
malformed address is refused right there (InvalidArgumentError), not at the first
request.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from rsproto.slots import placement_problem

from .admin import Admin
from .claims import Claim
from .connection import DEFAULT_CONNECT_TIMEOUT, Connection
from .errors import InvalidArgumentError
from .events import ConnectionEvent
from .fence import Fence
from .groups import TaskGroup
from .keeper import LeaseKeeper
from .leases import declare_lost
from .mailboxes import Mailbox, Mailboxes
from .pools import Pool, Pools, end_slots_elsewhere
from .quotas import Quota, Quotas
from .schedules import Schedules
from .session import Session
from .shards import Shards
from .tasks import Ticket
from .tracing import spans_for
from .wire import Limits, Op

__all__ = ["AsyncRunstate", "Scope", "Scopes"]

DEFAULT_ADDRESS = "127.0.0.1:7420"


class AsyncRunstate:
    """The client: one connection to rsd shared by every coroutine of one event loop.

    ``address`` is ``HOST:PORT``, or the nodes of a cluster as a comma-separated list
    (``"h1:7420,h2:7420,h3:7420"``: the client follows the primary); default
    ``$RUNSTATE_ADDRESS`` (the same forms), then ``127.0.0.1:7420``. ``connect_timeout``
    bounds each connect, every retry, redirect and handshake included: an unreachable
    server is an UnavailableError naming the address and cause after it. A client that
    was connected to a cluster reconnects for two cluster leases more (a takeover takes
    about one).
    """

    def __init__(
        self,
        holder: str | None = None,
        address: str | None = None,
        token: str | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        tracer_provider: Any = None,
    ) -> None:
        """``address``: ``HOST:PORT`` or ``tls://HOST:PORT``, or a comma-separated list of
        them, every node of a cluster (default ``$RUNSTATE_ADDRESS``, then
        127.0.0.1:7420). ``token``: sent in HELLO (default ``$RUNSTATE_TOKEN``); a
        refused one raises AuthenticationError and is never retried. ``tls``: a context
        for TLS with your own CAs or a client certificate, for every node (implied, with
        the system's CAs, by ``tls://``). ``tracer_provider``: the OpenTelemetry
        tracer provider of the client's spans (default: the global one, if one is set
        by then; ``tracing.py``)."""
        if holder is None:
            holder = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(holder, str) or not holder:
            raise InvalidArgumentError("holder must be a non-empty string")
        self.holder = holder
        if address is None:
            address = os.environ.get("RUNSTATE_ADDRESS") or DEFAULT_ADDRESS
        self.address = address
        if token is None:
            token = os.environ.get("RUNSTATE_TOKEN") or None
        self._conn = _connection(address, holder, token, connect_timeout, tls)
        self._keeper = LeaseKeeper(self._conn)
        self._session = Session(self._conn, self._keeper)
        self._session.spans = spans_for(tracer_provider)
        self._shards = Shards(self._session, self._conn)  # inert unless a HELLO names a shard
        self.scopes = Scopes(self)
        self.mailboxes = Mailboxes(self._session)
        self.pools = Pools(self._session)
        self.quotas = Quotas(self._session)
        self.fence = Fence(self._session)
        self.admin = Admin(self._session)  # admin-only calls (rsctl's)

    def __repr__(self) -> str:
        return f"<AsyncRunstate holder={self.holder!r} address={self.address!r}>"

    async def __aenter__(self) -> AsyncRunstate:
        await self._conn.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect now rather than on first use (optional)."""
        await self._conn.connect()

    async def close(self) -> None:
        """End every lease still held (code still working under one is told, as for any
        loss: its coroutine is cancelled), release them, then close the connection (of a
        sharded cluster, every shard's)."""
        for session in self._shards.sessions():
            for lease in session.keeper.leases():
                declare_lost(lease, "the client was closed")
                with contextlib.suppress(Exception):
                    await lease.release()
        self._keeper.close()
        await self._shards.close()
        await self._conn.close()

    def on_connection_event(
        self, callback: Callable[[ConnectionEvent], object]
    ) -> Callable[[], None]:
        """Call ``callback(event)`` on every connection event (connected, disconnected,
        reconnecting, restored), later on the loop so it never blocks the client.
        Returns a function that unsubscribes."""
        return self._conn.events.subscribe(callback)

    def connection_events(self) -> AsyncIterator[ConnectionEvent]:
        """``async for event in rs.connection_events():`` every connection event from
        now on (see ``events.py``; a reader that falls far behind loses the oldest)."""
        return self._conn.events.stream()

    async def ping(self) -> dict[str, Any]:
        """Ask the server for its time: a round trip that changes nothing."""
        return cast("dict[str, Any]", await self._session.call(Op.PING, {}))

    async def server_stats(self) -> dict[str, Any]:
        """The server's counters: connections, core tables, journal writes and fsyncs."""
        return cast("dict[str, Any]", await self._session.call(Op.SERVER_STATS, {}))

    def scope(self, scope_id: str) -> Scope:
        """The run ``scope_id`` (made by ``scopes.create()``, maybe in another process).
        No I/O: a run never created is NotFoundError at the first request naming it."""
        return Scope(self, scope_id)


def _connection(
    address: str,
    holder: str,
    token: str | None,
    connect_timeout: float,
    tls: ssl.SSLContext | None = None,
) -> Connection:
    """The client's connection, with every mistake in its arguments refused as an
    InvalidArgumentError now rather than as some other error at the first request."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidArgumentError(f"address must be HOST:PORT, got {address!r}")
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float) or not (
        0 < connect_timeout <= 3600
    ):
        raise InvalidArgumentError(
            f"connect_timeout must be a number of seconds in (0, 3600], got {connect_timeout!r}"
        )
    try:
        return Connection(address, holder, token, tls=tls, connect_timeout=connect_timeout)
    except InvalidArgumentError:
        raise
    except (ValueError, OverflowError) as exc:
        raise InvalidArgumentError(str(exc)) from None


class Scopes:
    """``rs.scopes``: making new runs."""

    def __init__(self, client: AsyncRunstate) -> None:
        self._client = client

    async def create(self, id: str | None = None, *, placement: str | None = None) -> Scope:
        """A new run with a fresh id (``scope.id``), to hand to other processes; or,
        with ``id``, the run of that chosen id (``"nightly-2026-12-01"``), made if it
        does not exist yet: idempotent, so every process of a job may call it.
        ``scope.created`` says whether this call made it. ``placement`` (a fresh id
        only: 1 to 64 UTF-8 bytes, no braces): the run goes to the slot of that
        string, so runs of one placement (a tenant, a customer) share a shard of a
        sharded cluster and its pools and quotas named ``{placement}...``; its id
        is ``{placement}`` followed by 24 hex digits."""
        args: dict[str, Any] = {} if id is None else {"scope": id}
        if id is not None:
            Scope(self._client, id)  # checks the id before any I/O
        if placement is not None:
            if id is not None:
                raise InvalidArgumentError("give a run id or a placement, not both")
            problem = placement_problem(placement)
            if problem is not None:
                raise InvalidArgumentError(problem)
            args["placement"] = placement
        reply = await self._client._session.call(Op.SCOPE_CREATE, args)
        scope = Scope(self._client, reply["scope"])
        scope.created = bool(reply.get("created", True))
        return scope

    async def cancel(self, scope_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run ``scope_id``, as ``rs.scope(scope_id).cancel(reason)``."""
        return await Scope(self._client, scope_id).cancel(reason)


class Scope:
    """A run: the namespace of claims (and later tasks and queues) its workers share."""

    def __init__(self, client: AsyncRunstate, scope_id: str) -> None:
        if not isinstance(scope_id, str) or not scope_id:
            raise InvalidArgumentError("a scope id must be a non-empty string")
        if len(scope_id.encode()) > Limits.MAX_SCOPE_ID_BYTES:
            raise InvalidArgumentError(
                f"a scope id may be at most {Limits.MAX_SCOPE_ID_BYTES} bytes"
            )
        self._session = client._session
        self.id = scope_id
        self.schedules = Schedules(self._session, scope_id)  # run.schedules.ensure(...)
        # True/False when returned by ``scopes.create`` (whether that call made it);
        # None for a handle from ``rs.scope(id)``, which asks nothing.
        self.created: bool | None = None

    def __repr__(self) -> str:
        return f"<Scope {self.id}>"

    def claim(
        self, key: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS,
        *, release_on_disconnect: bool = False,
    ) -> Claim:
        """The claim on ``key`` in this run (no I/O until it is used).
        ``release_on_disconnect``: each grant ends the moment its connection closes."""
        return Claim(
            self._session, self.id, key, lease_seconds,
            release_on_disconnect=release_on_disconnect,
        )

    def pool(
        self, name: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS,
        *, release_on_disconnect: bool = False,
    ) -> Pool:
        """A slot of the pool ``name`` for this run, held like a claim (and, with
        ``release_on_disconnect``, ending like one with its connection)."""
        return Pool(
            self._session, self.id, name, lease_seconds,
            release_on_disconnect=release_on_disconnect,
        )

    def quota(self, name: str) -> Quota:
        """The quota ``name``, taken from by this run."""
        return Quota(self._session, self.id, name)

    def mailbox(self, name: str) -> Mailbox:
        """The mailbox ``name`` inside this run (defined once by ``rs.mailboxes.ensure``)."""
        return Mailbox(self._session, self.id, name)

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id (from any process); nothing is re-run."""
        return Ticket(self._session, self.id, task_id)

    def group(self, name: str) -> TaskGroup:
        """The task group ``name`` of this run (tasks join it by ``submit(group=name)``)."""
        return TaskGroup(self._session, self.id, name)

    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run: its tasks end CANCELLED (result waiters told, running workers
        lose their deliveries), its claims and pool slots end, its waits are refused,
        and new work in it is refused with ScopeCancelledError. Returns how many tasks,
        claims and slots it ended: ``{"scope", "cancelled", "tasks", "claims", "slots"}``."""
        reply = await self._session.call(
            Op.SCOPE_CANCEL, {"scope": self.id, "reason": reason}
        )
        await end_slots_elsewhere(self._session, self.id)  # slots of other shards' pools
        return cast("dict[str, Any]", reply)

    async def status(self) -> dict[str, Any]:
        """``{"scope", "state": "open" | "cancelled", "reason", "created_at", "tasks":
        {state: count}, "claims", "slots"}``: the run as the server counts it now."""
        reply = await self._session.call(Op.SCOPE_STATUS, {"scope": self.id})
        return cast("dict[str, Any]", reply)
