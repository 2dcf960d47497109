"""Concurrency pools: ``rs.pools`` defines them, ``run.pool(name)`` holds a slot of one.

``await rs.pools.ensure(name, size=N)`` defines a pool of N slots shared by every run
(declarative: ensuring again resizes it; a smaller size revokes no held slot).
``run.pool(name)`` has the claim's API and defaults, because a slot is held exactly like
a claim, under a ``Lease`` the keeper renews: ``run(fn, wait=False, timeout_ms=30_000)``,
``acquire(...)``, ``try_acquire()`` (``{"kind": "busy"}`` or ``{"kind": "acquired",
"lease": lease}``) and ``async with``. A full pool without waiting raises ConflictError
with code POOL_FULL; a lost slot lease cancels ``run()``'s coroutine and raises
LeaseLostError. Waiting is done by the server (FIFO); nothing polls.
``run.pool(name, release_on_disconnect=True)``: as for a claim, each slot ends with the
connection it was granted on, and is lost here the moment that connection drops.

Of a sharded cluster, a pool lives on the shard of its name's slot and serves runs of
every shard: the slot is acquired, renewed and released there (``_granting``), so a
pool's limit holds across every shard. A run of another shard's slot is tied to its
lease alone on the pool's shard (rsd/core/holds/poolbook.py): ``run.cancel()`` releases
the slots this client holds for the run on other shards (their holders see
LeaseLostError, as when the server ends them), and a slot whose holder stops renewing
ends with its lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .claims import Claim
from .errors import ConflictError
from .leases import declare_lost
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session
    from .views import Busy

__all__ = ["Pool", "Pools", "end_slots_elsewhere"]

SCOPE_CANCELLED = "scope cancelled"  # the reason the server gives for the slots it ends


class Pools:
    """``rs.pools``: defining and inspecting concurrency pools."""
    def __init__(self, session: Session) -> None:
        self._session = session

    async def ensure(self, name: str, *, size: int) -> dict[str, Any]:
        """Create the pool, or bring it to ``size`` slots. Idempotent."""
        reply = await self._session.call(
            Op.POOL_ENSURE, {"name": name, "size": size}
        )
        return cast("dict[str, Any]", reply)

    async def inspect(
        self, name: str, *, limit: int = Limits.DEFAULT_POOL_INSPECT_HOLDERS
    ) -> dict[str, Any]:
        """``{"name", "size", "held", "waiters", "holders"}``; ``holders`` lists up to
        ``limit`` of them as ``{"holder", "run", "generation", "expires_at"}``."""
        reply = await self._session.call(
            Op.POOL_INSPECT, {"name": name, "limit": limit}
        )
        return cast("dict[str, Any]", reply)


class Pool(Claim):
    """One slot of a pool, for one run: acquired, held and released like a claim."""

    _ACQUIRE_OP = Op.POOL_ACQUIRE
    _RELEASE_OP = Op.POOL_RELEASE

    def __init__(
        self, session: Session, scope: str, name: str,
        lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS,
        *, release_on_disconnect: bool = False,
    ) -> None:
        super().__init__(
            session, scope, name, lease_seconds, release_on_disconnect=release_on_disconnect
        )
        self.name = name

    def __repr__(self) -> str:
        return f"<Pool {self.name} in {self.scope}>"

    async def inspect(self) -> dict[str, Any]:  # type: ignore[override]
        """The pool as the server sees it (see ``Pools.inspect``)."""
        reply = await self._session.call(
            Op.POOL_INSPECT, {"name": self.name}
        )
        return cast("dict[str, Any]", reply)

    def _granting(self) -> Session:
        """A pool lives on the shard of its name's slot, and grants there to runs of
        every shard: the slot's lease is kept (renewed, released) on that shard's
        connection, wherever the run lives."""
        return self._session.for_run(self.name)

    def _target(self) -> dict[str, Any]:
        return {"scope": self.scope, "pool": self.name}

    def _what(self) -> str:
        return f"a slot of pool {self.name!r}"

    def _busy(self, exc: ConflictError) -> Busy:
        return {"kind": "busy"}


async def end_slots_elsewhere(session: Session, scope: str) -> int:
    """Run ``scope`` was cancelled: the leases this client holds for it on shards other
    than the run's own (pool slots of pools homed elsewhere, which their shard cannot
    tie to the run) are declared lost, as the server declares those it ends, and
    released; how many. The run's own shard ends the rest itself. Nothing to do unless
    the client routes (a server alone, or one shard, ends them all)."""
    router = session.router
    if router is None:
        return 0
    own = session.for_run(scope)
    ended = [lease for other in router.sessions() if other is not own
             for lease in other.keeper.leases() if lease.scope == scope]
    for lease in ended:
        declare_lost(lease, SCOPE_CANCELLED)
    for lease in ended:
        await lease.release_quietly()
    return len(ended)
