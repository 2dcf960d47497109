"""Concurrency pools: N slots of a tenant shared by all its runs, each slot held by a lease.

What always holds:
- a pool is named per tenant, ``(tenant, name)``; it exists once ensured (POOL_ENSURE,
  declarative) and is never forgotten, so a tenant has at most ``max_pools_per_tenant``;
- a slot is granted only while the pool holds fewer leases than its size: a grant never
  makes ``len(holders) > size``. Shrinking the size revokes nothing; the extra holders
  leave as their leases end, and no slot is granted until the pool is below its size;
- a slot is a lease (leases.py) whose owner is a ``Slot``: renewed by LEASE_RENEW like
  any lease, ended by POOL_RELEASE with its live lease (anything else is STALE_CLAIM, the
  fencing of a claim), or by expiry, which pushes LEASE_LOST to its holder;
- each grant takes the pool's generation plus one, so a pool's generations grow
  strictly and never repeat: a new pool starts at the server's generation floor, and
  after an unclean stop every pool jumps with the claims (``jump_generations``);
- waiters queue FIFO and exist only while the pool is full: whenever a slot frees
  (release, expiry, a larger size) the first waiters still waiting are granted in the
  same call, each by the deferred reply to its POOL_ACQUIRE. A non-waiting acquire
  never passes them: while anyone waits, the pool is full (POOL_FULL);
- a waiter is a Wait (waits.py): granted, timed out, cancelled or dropped with its
  connection, leaving the line in O(1) amortised; at most ``max_waiters_per_pool``.
Slots are journaled (POOL_GRANTED / POOL_ENDED) and snapshotted, so holders survive a
restart, each live for one full lease afterwards, like every lease.

Runs of any shard (issue 32). A pool lives on the shard of its name's slot (its one
home), and grants slots to runs of every shard: a POOL_ACQUIRE goes to the pool's
shard, whatever the run's (rsproto/sdkrules.py ROUTE: NAME). The slot records its run's
id as its ``scope`` in either case, so the pool's limit is counted in one place and no
slot is ever granted twice. What ties a slot to its run differs:
- a run of this shard (its ``Scope`` is here: ``Tables.holding_run``) holds the slot in
  ``scope.slots``: its cancellation ends it at once (``run_cancelled``), a cancelled
  run is refused a slot, and the run does not move to another shard while it holds one
  (transfer.py);
- a run of another shard has no ``Scope`` here, and this shard cannot see it (neither
  whether it exists nor its cancellation): its slot is tied to its lease alone. It ends
  when released, when its lease lapses (its holder stopped renewing: died, lost its
  shard, or gave up), or with its connection (``release_on_disconnect``); the run's
  cancellation reaches it through the SDK, which releases the slots it holds for a run
  it cancels (rsclient: ``Scope.cancel``), and otherwise within one lease once the
  holder's work ends. A run may then move between shards while it holds such a slot:
  the slot is not on its shard (and a slot granted while its run was elsewhere stays
  tied to its lease alone if the run moves here). We decided against the run's shard
  telling the pool's of each cancellation (a message between shards, to be made
  reliable across both primaries' faults) while a lease already bounds how long a
  forgotten slot is held.
Appliers link a slot to its run only if the run is here (``find_scope``), never make
one: a replayed grant for a run of another shard must not become a run of this shard
(a standby replays without the slot map). So a slot may be linked to a run that is
here without being this shard's (a copy a move cut short left here, until it is
dropped), or that came here after the grant (restored from a snapshot, where the run
comes first): the slot is then tied to the run as its own are (more tied, never
less), and a run dropped after a move leaves such slots to their leases (transfer.py).
One cost: a slot that a journal of format 3 (runs made by first use) granted as its
run's very first use is kept, renewed and released as any, but not ended by that
run's cancellation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..ground.effects import DEFERRED
from ..ground.errors import CoreError
from ..ground.leases import NO_CONN, Lease, LeaseBase, lease_id_of
from ..ground.pages import PagedIndex
from ..ground.validate import int_arg, lease_seconds, opt_bool, opt_number, req_handle, req_text
from ..ground.waits import WaitLine
from ..records import PoolEnded, PoolEnsured, PoolGranted, Rec, SnapPool, SnapPoolSlot
from ..run.claim import grant_view
from ..run.scope import Scope
from ..state.tables import Applier, Handler, Tables
from ..tenant.pool import Pool, PoolWaiter, Slot, holder_row

__all__ = ["Pool", "PoolBook", "Slot"]

PoolKey = tuple[str, str]  # (tenant, name)


def _always(pool: Pool) -> bool:
    return True


class PoolBook:
    """The pool rules. Owned by the Core, which hands it the shared tables."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.leases = tables.leases
        self.waits = tables.waits
        self.effects = tables.effects
        self.pools: dict[PoolKey, Pool] = {}
        self.pages: dict[str, PagedIndex[Pool]] = {}  # tenant -> its pools (admin.py)
        self.per_tenant: dict[str, int] = {}
        self.events = tables.events
        self.ops: dict[int, Handler] = {
            Op.POOL_ENSURE: self.ensure,
            Op.POOL_ACQUIRE: self.acquire,
            Op.POOL_RELEASE: self.release,
            Op.POOL_INSPECT: self.inspect,
        }
        self.appliers: dict[int, Applier] = {
            Rec.POOL_ENSURED: self.apply_ensured,
            Rec.POOL_GRANTED: self.apply_granted,
            Rec.POOL_ENDED: self.apply_ended,
            Rec.SNAP_POOL: self.apply_snapshot,
            Rec.SNAP_POOL_SLOT: self.apply_snapshot_slot,
        }

    # ---- ops -------------------------------------------------------------------------

    def ensure(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant = self.tables.tenant_of(conn)
        name = req_text(args, "name", Limits.MAX_POOL_NAME_BYTES)
        size = int_arg(args, "size", 1, Limits.MAX_POOL_SIZE)
        pool = self.pools.get((tenant, name))
        created = pool is None
        if pool is None and self.per_tenant.get(tenant, 0) >= Limits.MAX_POOLS_PER_TENANT:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"this tenant already has {Limits.MAX_POOLS_PER_TENANT} pools, the limit",
            )
        if pool is None or pool.size != size:
            pool = self.tables.commit(PoolEnsured(Rec.POOL_ENSURED, tenant, name, size), now)
            assert pool is not None
            self.fill(now, pool)  # a larger size lets waiters in at once
        return {**self._view(pool), "created": created}

    def acquire(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        tenant = self.tables.tenant_of(conn)
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        name = req_text(args, "pool", Limits.MAX_POOL_NAME_BYTES)
        length = lease_seconds(args, self.tables.min_lease_seconds)
        wait = opt_bool(args, "wait", False)
        bound = opt_bool(args, "release_on_disconnect", False)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        pool = self._find(tenant, name)
        scope = self.tables.holding_run(tenant, scope_id)  # None: a run of another shard
        if scope is not None:
            scope.refuse_if_cancelled()
        holder = self.tables.holders.get(conn, "")
        if pool.has_free_slot():
            lease = self._grant(now, conn, pool, scope_id, holder, length, bound)
            return grant_view(lease, lease.owner.generation)
        if not wait:
            raise CoreError(
                ErrorCode.POOL_FULL,
                f"pool {name!r} has all {pool.size} slots held"
                + (f" and {len(pool.waiters)} waiters" if pool.waiters else ""),
                {"size": pool.size, "held": len(pool.holders), "waiters": len(pool.waiters)},
            )
        if timeout_ms == 0:
            raise CoreError(ErrorCode.WAIT_TIMEOUT, f"pool {name!r} is full; timeout_ms is 0")
        if len(pool.waiters) >= Limits.MAX_WAITERS_PER_POOL:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"pool {name!r} already has {Limits.MAX_WAITERS_PER_POOL} waiters, the limit",
            )
        waiter = PoolWaiter(
            pool, scope_id, conn, rid, holder, length, now + timeout_ms / 1000.0, now, bound
        )
        waiter.run = scope  # its cancellation ends it (a run of this shard's)
        if not pool.waiters:
            pool.waiters = WaitLine()
        pool.waiters.append(waiter)
        self.waits.add(waiter)
        return DEFERRED

    def release(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._current(conn, req_handle(args))
        self._end(now, lease, "released")
        return {}

    def inspect(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant = self.tables.tenant_of(conn)
        name = req_text(args, "name", Limits.MAX_POOL_NAME_BYTES)
        limit = int_arg(
            args, "limit", 0, Limits.MAX_POOL_INSPECT_HOLDERS,
            Limits.DEFAULT_POOL_INSPECT_HOLDERS,
        )
        pool = self._find(tenant, name)
        wall = self.tables.wall
        bound = self.leases.bound
        holders = [
            holder_row(lease, wall(lease.expires_at), lease.handle in bound)
            for lease in itertools.islice(pool.holders.values(), limit)
        ]
        return {**self._view(pool), "holders": holders}

    # ---- events ----------------------------------------------------------------------

    def expired(self, now: float, lease: Lease, reason: str = "expired") -> None:
        """``lease_expired``: a slot's lease ran out, or (``reason`` "connection closed")
        the connection it was bound to closed: it ends, the pool's waiters get it."""
        slot: Slot = lease.owner
        self._end(now, lease, reason, lost=True)
        self.tables.effects.note(
            "slot lease expired" if reason == "expired" else "slot lease ended with its "
            "connection", pool=slot.pool.name, scope=slot.scope, lease=lease.id,
            holder=lease.holder, generation=slot.generation,
        )

    def run_cancelled(self, now: float, scope: Scope) -> None:
        """``run_cancelled``: the slots the run holds end (LEASE_LOST, reason "scope
        cancelled") and their pools' waiters get them. O(the run's slots). The run's own
        waiters were refused first (ScopeBook), so none of them is granted here."""
        for lease in list(scope.slots.values()):
            self._end(now, lease, "scope cancelled", lost=True)

    # ---- records ---------------------------------------------------------------------

    def apply_ensured(self, rec: PoolEnsured, now: float) -> Pool:
        _, tenant, name, size = rec
        pool = self.pools.get((tenant, name))
        if pool is None:
            pool = self._new_pool(tenant, name, size, self.tables.ids.generation_floor)
        pool.size = size
        return pool

    def apply_granted(self, rec: PoolGranted, now: float) -> LeaseBase | None:
        _, tenant, name, handle, generation, holder, scope_id, length, bound = rec
        existing = self.leases.get(handle)
        if existing is not None:
            return existing
        if self.leases.ids.seen(tenant, lease_id_of(handle)):
            return None  # an ended slot replayed again
        return self._add_slot(
            tenant, name, handle, generation, holder, scope_id, length, now, bound
        )

    def apply_ended(self, rec: PoolEnded, now: float) -> Pool | None:
        lease = self.leases.get(rec[1])
        if lease is None or type(lease.owner) is not Slot:
            return None
        self.leases.end(lease)
        slot = lease.owner
        pool = slot.pool
        pool.holders.pop(lease.handle, None)
        scope = self.tables.find_scope(pool.tenant, slot.scope)
        if scope is not None:
            scope.slots.pop(lease.handle, None)
            self.tables.release_scope(scope)
        return pool

    # ---- snapshots and crashes -------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """One SNAP_POOL per pool, then one SNAP_POOL_SLOT per held slot."""
        bound = self.leases.bound
        for pool in self.pools.values():
            yield SnapPool(Rec.SNAP_POOL, pool.tenant, pool.name, pool.size, pool.generation)
            for lease in pool.holders.values():
                slot = lease.owner
                if type(slot) is not Slot:
                    continue  # attached: its owner's own record restores it
                yield SnapPoolSlot(
                    Rec.SNAP_POOL_SLOT, pool.tenant, pool.name, lease.handle, slot.generation,
                    lease.holder, slot.scope, lease.length, lease.handle in bound,
                )

    def apply_snapshot(self, rec: SnapPool, now: float) -> None:
        _, tenant, name, size, generation = rec
        pool = self.pools.get((tenant, name))
        if pool is None:
            pool = self._new_pool(tenant, name, size, generation)
        pool.size = size
        pool.generation = max(pool.generation, generation)

    def apply_snapshot_slot(self, rec: SnapPoolSlot, now: float) -> None:
        _, tenant, name, handle, generation, holder, scope_id, length, bound = rec
        if self.leases.get(handle) is None:
            self._add_slot(
                tenant, name, handle, generation, holder, scope_id, length, now, bound
            )

    def jump_generations(self, delta: int) -> None:
        """After an unclean stop (IDS_JUMPED): at most ``delta`` grants were lost, each
        one above the generation before it, so every pool moves ``delta`` on. O(pools),
        once per recovery."""
        for pool in self.pools.values():
            pool.generation += delta

    # ---- internals -------------------------------------------------------------------

    def _new_pool(self, tenant: str, name: str, size: int, generation: int) -> Pool:
        pool = self.pools[(tenant, name)] = Pool(tenant, name, size, generation)
        self.per_tenant[tenant] = self.per_tenant.get(tenant, 0) + 1
        pages = self.pages.get(tenant)
        if pages is None:  # pools are never removed: every entry stays alive
            pages = self.pages[tenant] = PagedIndex(_always)
        pages.add(pool)
        return pool

    def _add_slot(
        self, tenant: str, name: str, handle: bytes, generation: int, holder: str,
        scope_id: str, length: float, now: float, bound: bool,
    ) -> Lease | None:
        """A slot's lease (``bound``: to no connection yet, ``NO_CONN``: a live grant
        binds it to its own, ``_grant``)."""
        pool = self.pools.get((tenant, name))
        if pool is None:
            return None  # a grant can only follow its pool's record; nothing to attach to
        if pool.generation < generation:
            pool.generation = generation
        leases = self.leases
        lease = leases.add(handle, Slot(pool, scope_id, generation), holder, NO_CONN, length, now)
        if bound:
            leases.bind(lease, NO_CONN)
        pool.holders[handle] = lease
        scope = self.tables.find_scope(tenant, scope_id)
        if scope is not None:  # None: a run of another shard (the module's notes)
            scope.slots[handle] = lease
        return lease

    def _view(self, pool: Pool) -> dict[str, Any]:
        return {
            "name": pool.name,
            "size": pool.size,
            "held": len(pool.holders),
            "waiters": len(pool.waiters),
        }

    def _find(self, tenant: str, name: str) -> Pool:
        pool = self.pools.get((tenant, name))
        if pool is None:
            raise CoreError(
                ErrorCode.NOT_FOUND, f"pool {name!r} does not exist: ensure it first"
            )
        return pool

    def _current(self, conn: int, handle: bytes) -> LeaseBase:
        """The live slot lease with this handle, of this connection's tenant, or
        STALE_CLAIM (a wrong handle, another tenant's or another kind of lease alike)."""
        lease = self.tables.own_lease(conn, handle)
        if lease is None or type(lease.owner) is not Slot:
            raise CoreError(
                ErrorCode.STALE_CLAIM,
                f"lease {handle.hex()} is not a current pool slot: it expired, was released "
                "or never existed",
            )
        return lease

    def _grant(
        self, now: float, conn: int, pool: Pool, scope_id: str, holder: str, length: float,
        bound: bool,
    ) -> Lease:
        """A slot of ``pool`` to ``holder`` on ``conn`` (``bound``: until that connection
        closes at the latest)."""
        rec = PoolGranted(
            Rec.POOL_GRANTED, pool.tenant, pool.name, self.tables.new_lease_handle(pool.tenant),
            pool.generation + 1, holder, scope_id, length, bound,
        )
        lease: Lease | None = self.tables.commit(rec, now)  # live: a new slot's lease
        assert lease is not None
        lease.conn = conn
        if bound:
            self.leases.bind(lease, conn)
        return lease

    def _end(self, now: float, lease: LeaseBase, reason: str, *, lost: bool = False) -> None:
        """End a slot's lease (POOL_ENDED; LEASE_LOST pushed to its holder if ``lost``)
        and let the first waiters in while there is room."""
        pool = self.tables.commit(PoolEnded(Rec.POOL_ENDED, lease.handle, reason), now)
        if lost:
            self.effects.lease_lost(lease, reason)
        if pool is not None:
            self.fill(now, pool)

    def fill(self, now: float, pool: Pool) -> None:
        """Grant waiters, first in first out, while the pool has room. O(grants made).
        Live path only (writes grant records): also after a lease attached by
        ``capacity.attach`` ended and was detached."""
        while pool.waiters and len(pool.holders) < pool.size:
            waiters = pool.waiters
            assert isinstance(waiters, WaitLine)
            waiter = waiters.popleft()
            if not waiters:
                pool.waiters = ()
            if waiter is None:
                break
            assert isinstance(waiter, PoolWaiter)
            self.waits.served(waiter)
            lease = self._grant(now, waiter.conn, pool, waiter.scope, waiter.holder,
                                waiter.length, waiter.bound)
            self.effects.reply(
                waiter.conn,
                waiter.request_id,
                grant_view(lease, lease.owner.generation, now - waiter.since),
            )
        if len(pool.holders) < pool.size:  # room left after its waiters: blocked items
            self.events.capacity_freed(pool)
