"""``AsyncRunstate``: the client object, and the scope (run) handles it gives out.

One client holds one persistent connection (opened on first use), one lease keeper and
the session that lends both to its handles. Constructing it does no I/O, so it can be
built outside a running event loop.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from .claims import Claim
from .connection import Connection
from .errors import InvalidArgumentError
from .keeper import LeaseKeeper
from .leases import declare_lost
from .mailboxes import Mailbox, Mailboxes
from .pools import Pool, Pools
from .quotas import Quota, Quotas
from .session import Session
from .tasks import Ticket
from .wire import Limits, Op

__all__ = ["AsyncRunstate", "Scope", "Scopes"]

DEFAULT_ADDRESS = "127.0.0.1:7420"


class AsyncRunstate:
    def __init__(
        self,
        holder: str | None = None,
        address: str | None = None,
        token: str | None = None,
        *,
        connect_timeout: float = 10.0,
    ) -> None:
        if holder is None:
            holder = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(holder, str) or not holder:
            raise InvalidArgumentError("holder must be a non-empty string")
        self.holder = holder
        self.address = address or os.environ.get("RUNSTATE_ADDRESS") or DEFAULT_ADDRESS
        self._conn = Connection(self.address, holder, token, connect_timeout=connect_timeout)
        self._keeper = LeaseKeeper(self._conn)
        self._session = Session(self._conn, self._keeper)
        self.scopes = Scopes(self)
        self.mailboxes = Mailboxes(self._session)
        self.pools = Pools(self._session)
        self.quotas = Quotas(self._session)

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
        loss: its coroutine is cancelled), release them, then close the connection."""
        for lease in self._keeper.leases():
            declare_lost(lease, "the client was closed")
            with contextlib.suppress(Exception):
                await lease.release()
        self._keeper.close()
        await self._conn.close()

    async def ping(self) -> dict[str, Any]:
        return await self._conn.request(Op.PING, {})

    async def server_stats(self) -> dict[str, Any]:
        """The server's counters: connections, core tables, journal writes and fsyncs."""
        return await self._conn.request(Op.SERVER_STATS, {})

    def scope(self, scope_id: str) -> Scope:
        return Scope(self, scope_id)


class Scopes:
    def __init__(self, client: AsyncRunstate) -> None:
        self._client = client

    async def create(self) -> Scope:
        reply = await self._client._session.request(Op.SCOPE_CREATE, {})
        return Scope(self._client, reply["scope"])


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

    def __repr__(self) -> str:
        return f"<Scope {self.id}>"

    def claim(self, key: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS) -> Claim:
        return Claim(self._session, self.id, key, lease_seconds)

    def pool(self, name: str, lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS) -> Pool:
        """A slot of the pool ``name`` for this run, held like a claim."""
        return Pool(self._session, self.id, name, lease_seconds)

    def quota(self, name: str) -> Quota:
        """The quota ``name``, taken from by this run."""
        return Quota(self._session, self.id, name)

    def mailbox(self, name: str) -> Mailbox:
        return Mailbox(self._session, self.id, name)

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id (from any process); nothing is re-run."""
        return Ticket(self._session, self.id, task_id)

    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run: its tasks end CANCELLED, its claims and waits end."""
        return await self._session.request(Op.SCOPE_CANCEL, {"scope": self.id, "reason": reason})
