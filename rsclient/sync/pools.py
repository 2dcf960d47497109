"""Sync pools and quotas: ``rs.pools``, ``rs.quotas``, ``run.pool(name)``,
``run.quota(name).take()``.

A thin layer over ``rsclient.pools`` and ``rsclient.quotas``: every rule (FIFO waits done
by the server, slot leases renewed and lost like a claim's, POOL_FULL, QUOTA_EXHAUSTED) is
the async client's, run on the client's loop thread, and every method is derived from
the async one (``_derive.py``). A slot is the sync ``Claim`` over an async ``Pool``:
``with run.pool("gpu").acquire(wait=True) as lease:``, ``run.pool("gpu").run(fn)``,
``try_acquire()``.
"""

from __future__ import annotations

from .. import pools as apools
from .. import quotas as aquotas
from ._derive import Handle, blocking

__all__ = ["Pools", "Quota", "Quotas"]


class Pools(Handle[apools.Pools]):
    """``rs.pools``: defining and reading concurrency pools."""

    ensure = blocking(apools.Pools.ensure)
    inspect = blocking(apools.Pools.inspect)


class Quotas(Handle[aquotas.Quotas]):
    """``rs.quotas``: defining and reading token-bucket quotas."""

    ensure = blocking(aquotas.Quotas.ensure)
    inspect = blocking(aquotas.Quotas.inspect)


class Quota(Handle[aquotas.Quota]):
    """A quota as used by one run, for sync code."""

    def __repr__(self) -> str:
        return f"<sync Quota {self._async.name} in {self._async.scope}>"

    take = blocking(aquotas.Quota.take)
    inspect = blocking(aquotas.Quota.inspect)
