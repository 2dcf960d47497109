"""Sync pools and quotas: ``rs.pools``, ``rs.quotas``, ``run.pool(name)``,
``run.quota(name).take()``.

A thin layer over ``rsclient.pools`` and ``rsclient.quotas``: every rule (FIFO waits done
by the server, slot leases renewed and lost like a claim's, POOL_FULL, QUOTA_EXHAUSTED) is
the async client's, run on the client's loop thread. A slot is the sync ``Claim`` over an
async ``Pool``: ``with run.pool("gpu").acquire(wait=True) as lease:``,
``run.pool("gpu").run(fn)``, ``try_acquire()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import quotas as aquotas
from ..wire import Limits
from ._portal import Portal

if TYPE_CHECKING:
    from .client import Runstate

__all__ = ["Pools", "Quota", "Quotas"]


class Pools:
    """``rs.pools``: defining and reading concurrency pools."""

    def __init__(self, client: Runstate) -> None:
        self._client = client

    def ensure(self, name: str, *, size: int) -> dict[str, Any]:
        """Create the pool, or bring it to ``size`` slots. Idempotent."""
        client = self._client
        return client._portal.call(client._async.pools.ensure(name, size=size))

    def inspect(
        self, name: str, *, limit: int = Limits.DEFAULT_POOL_INSPECT_HOLDERS
    ) -> dict[str, Any]:
        """``{"name", "size", "held", "waiters", "holders"}``."""
        client = self._client
        return client._portal.call(client._async.pools.inspect(name, limit=limit))


class Quotas:
    """``rs.quotas``: defining and reading token-bucket quotas."""

    def __init__(self, client: Runstate) -> None:
        self._client = client

    def ensure(self, name: str, *, limit: int, per_seconds: float) -> dict[str, Any]:
        """Create the quota, or bring it to these settings. Idempotent."""
        client = self._client
        return client._portal.call(
            client._async.quotas.ensure(name, limit=limit, per_seconds=per_seconds)
        )

    def inspect(self, name: str) -> dict[str, Any]:
        """``{"name", "limit", "per_seconds", "level", "waiters", "head_amount"}``."""
        client = self._client
        return client._portal.call(client._async.quotas.inspect(name))


class Quota:
    """A quota as used by one run, for sync code."""

    def __init__(self, portal: Portal, quota: aquotas.Quota) -> None:
        self._portal = portal
        self._quota = quota

    def __repr__(self) -> str:
        return f"<sync Quota {self._quota.name} in {self._quota.scope}>"

    def take(
        self,
        amount: int = 1,
        *,
        wait: bool = True,
        timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> dict[str, Any]:
        """Take ``amount``, waiting in the server's FIFO line by default:
        ``{"taken", "level", "waited_ms"}``; see ``rsclient.quotas.Quota.take``."""
        return self._portal.call(self._quota.take(amount, wait=wait, timeout_ms=timeout_ms))

    def inspect(self) -> dict[str, Any]:
        """The quota as the server sees it."""
        return self._portal.call(self._quota.inspect())
