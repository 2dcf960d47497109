"""Taking capacity all at once: the slots and quota amounts one piece of work needs.

``try_take_all`` checks every pool and quota first and takes only if all of them can
give now, so nothing is ever held partly: two pieces of work needing the same pools in
another order cannot deadlock. It respects the books' FIFO rules (a pool or quota with
waiters gives nothing), changes nothing when it answers False, and costs O(needs).

Quota is spent at once (QUOTA_TAKEN records). The slots are attached to ``lease``: the
caller's own record must carry the pool names so that its applier re-attaches them on
replay (``attach``), and the end of ``lease`` must ``detach`` them (in its applier) and
then, live, ``PoolBook.fill`` the pools so that waiters get the slots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ground.leases import Lease
from ..tenant.quota import Quota
from .poolbook import Pool, PoolBook
from .quotabook import QuotaBook

__all__ = ["attach", "detach", "try_take_all"]


def attach(pool: Pool, lease: Lease) -> None:
    """Count ``lease`` (owned by something else, e.g. a delivery) as a holder of a slot
    of ``pool``. For appliers: the record of what the lease holds says so."""
    pool.holders[lease.handle] = lease


def detach(pool: Pool, handle: bytes) -> None:
    """The attached lease ended (for appliers; writes nothing)."""
    pool.holders.pop(handle, None)


def try_take_all(
    now: float,
    pools: PoolBook,
    quotas: QuotaBook,
    tenant: str,
    pool_names: Sequence[str],
    amounts: Mapping[str, int],
    lease: Lease,
) -> bool:
    """Take one slot of each named pool (for ``lease``) and each quota amount, or nothing.

    An unknown pool or quota, a full pool, a pool or quota with waiters, or a level
    below an amount: False, with nothing taken."""
    chosen: list[Pool] = []
    for name in pool_names:
        pool = pools.pools.get((tenant, name))
        if pool is None or not pool.has_free_slot():
            return False
        if pool not in chosen:  # a name given twice needs its one slot once
            chosen.append(pool)
    spend: list[tuple[Quota, int]] = []
    for name, amount in amounts.items():
        quota = quotas.quotas.get((tenant, name))
        if quota is None or amount > quota.limit or not quotas.can_take(now, quota, amount):
            return False
        spend.append((quota, amount))
    for quota, amount in spend:
        quotas.spend(now, quota, amount)
    for pool in chosen:
        attach(pool, lease)
    return True
