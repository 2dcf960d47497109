"""The core's shared tables, and the one path by which state changes: ``commit``.

Every book (claims, pools, quotas, mailboxes, runs, intake, deliveries, settlement,
endings, tasks, groups, admin) gets this one object
instead of loose callables: the lease table, the timer wheel, the wait registry, the
effects buffer, the named events (events.py), the scopes, the id counters, the
connections' holders and the wall clock (wallclock.py).

What always holds:
- a change of state is a record: ``commit(rec, now)`` appends it to the effects and
  applies it through ``apply``, the very table recovery replays, so a live change and
  its replay cannot drift apart;
- every applier has the signature ``(rec, now)`` and is idempotent: applying a record
  twice is harmless;
- scopes are keyed by ``(tenant, scope id)``: a request can only ever find its own
  tenant's scopes, and every run counts in its tenant's usage while it is in the table;
- a request never makes a run by naming it: ``run`` refuses an id never created;
- a run leaves the table only holding nothing (``release_scope``, ``drop_scope``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from rsproto import ErrorCode, Limits
from rsproto.slots import slot_of

from ..ground.effects import Effects
from ..ground.errors import CoreError
from ..ground.forwarded import Forwarded
from ..ground.ids import Ids
from ..ground.leases import LeaseBase, LeaseTable, new_handle
from ..ground.pages import PagedIndex
from ..ground.tenants import Tenants
from ..ground.waits import Waits
from ..ground.wallclock import WallClock
from ..records.declaration import WIDTH, read
from ..run.scope import IDLE, QUEUED, Scope, ScopeKey
from .events import Events

__all__ = ["Applier", "Book", "Handler", "Tables"]

Applier = Callable[[Any, float], Any]  # (rec: its declared type (records.py), now)
Handler = Callable[[float, int, int, dict[str, Any]], Any]  # (now, conn, rid, args)
# records/declaration.py is run as Python: a name imported from it is looked up at each
# use, a Final of this module's is a static (compiled).
_WIDTH: Final = WIDTH


class Book(Protocol):
    """What each book shows the Core: the ops it answers and the records it applies."""

    ops: dict[int, Handler]
    appliers: dict[int, Applier]


def _everywhere(scope_id: str) -> bool:
    """The predicate of a server alone: every run is its own."""
    return True


class Tables:
    __slots__ = (
        "after", "appliers", "at_wall", "cancel_at_wall", "clock", "effects", "events",
        "forwarded", "holders", "homes_run", "ids", "leases", "min_lease_seconds",
        "random_bytes", "replayed", "runs_by_slot", "scope_pages", "scopes", "slot_count",
        "tenants", "waits", "wall", "wheel",
    )

    def __init__(
        self,
        wall_offset: float,
        max_waits_per_connection: int,
        tenants: Tenants,
        random_bytes: Callable[[int], bytes],
        min_lease_seconds: float = Limits.MIN_LEASE_SECONDS,
    ) -> None:
        self.random_bytes = random_bytes  # the shell's randomness: lease handles
        # The shortest lease a request may ask for (validate.lease_seconds): the
        # protocol's, or lower when rsd's own tests ask (--test-min-lease-seconds).
        self.min_lease_seconds = min_lease_seconds
        self.effects = Effects()
        self.events = Events()  # who hears which is wired by the Core (machine.py)
        self.leases = LeaseTable(self.events.lease_expired)
        self.wheel = self.leases.wheel
        # The leases that left with their runs on a slot move (forwarded.py): MOVED, not
        # STALE_CLAIM, for a while; filled only by RUNS_DROPPED (transfer.py).
        self.forwarded = Forwarded(self.wheel)
        clock = self.clock = WallClock(wall_offset, self.wheel)
        # The wall clock's calls, bound once: every book reads them through the tables.
        self.wall = clock.wall
        self.at_wall = clock.at_wall
        self.cancel_at_wall = clock.cancel_at_wall
        self.after = clock.after
        self.scopes: dict[ScopeKey, Scope] = {}
        self.scope_pages: dict[str, PagedIndex[Scope]] = {}  # tenant -> its runs (admin.py)
        # The runs of each slot, kept only in a sharded cluster (``index_slots``): what a
        # slot move exports is found without a walk over every run (transfer.py).
        self.slot_count = 0  # the cluster's slots; 0: no index (a server alone)
        self.runs_by_slot: dict[int, dict[ScopeKey, Scope]] = {}
        self.replayed = False  # records were applied by ``apply`` since RunEnds.arm
        self.holders: dict[int, str] = {}  # connection id -> holder from its HELLO
        # Whether a run id's (or a pool's or quota's name's) slot is this shard's (the
        # shell's predicate, SlotOwner's ``owns_key``; a server alone: every one's):
        # ``holding_run``, and needs of another shard (needs.py).
        self.homes_run: Callable[[str], bool] = _everywhere
        self.tenants = tenants
        self.waits = Waits(
            self.wheel, self.effects, max_waits_per_connection, tenants, self.release_scope
        )
        self.ids = Ids()
        self.appliers: dict[int, Applier] = {}  # record type -> applier; filled by the Core

    # ---- records ---------------------------------------------------------------------

    def commit(self, rec: tuple[Any, ...], now: float) -> Any:
        """Record a change, then make it: the one way the core changes state. Returns
        what the applier returns (the lease, item or claim it touched, if any)."""
        self.effects.records.append(rec)
        return self.appliers[rec[0]](rec, now)

    def record(self, rec: tuple[Any, ...]) -> None:
        """``commit``'s first half, for a book about to apply a record of its own kind
        itself (a task's ITEM_ENQUEUED, DELIVERED, FINISHED), with the very applier it put
        in ``appliers`` for that kind (``Core`` asserts it), called natively: through
        ``appliers`` the compiled core calls a bound method as a Python object, its
        arguments boxed and parsed. Record, then apply, as ``commit``."""
        self.effects.records.append(rec)

    def apply(self, rec: Sequence[Any], now: float) -> Any:
        """Apply one record (recovery); the same appliers ``commit`` uses. A record read
        from a file is a list: the appliers get it as the tuple ``commit`` passes them
        (compiled, they check; a tuple is not copied)."""
        self.replayed = True
        if len(rec) != _WIDTH.get(rec[0]):  # (``read``'s test, inlined: recovery's loop)
            rec = read(rec)  # its declared fields (ValueError: a kind or layout unknown)
        applier = self.appliers.get(rec[0])
        if applier is None:
            raise ValueError(f"unknown record type {rec[0]!r}")
        return applier(tuple(rec), now)

    # ---- leases --------------------------------------------------------------------

    def new_lease_handle(self, tenant: str) -> bytes:
        """The handle for ``tenant``'s next lease id: the record of the grant carries it.
        Unique among live leases (lease ids are per tenant: another tenant's lease may
        have the same id, and then, once in 2**64, the same random part)."""
        lease_id = self.leases.ids.peek(tenant)
        handle = new_handle(lease_id, self.random_bytes(8))
        while handle in self.leases.live:
            handle = new_handle(lease_id, self.random_bytes(8))
        return handle

    def own_lease(self, conn: int, handle: bytes) -> LeaseBase | None:
        """The live lease with this exact handle, if it is ``conn``'s tenant's: the one
        lookup behind release and settlement (renewal inlines the same check). Another
        tenant's lease is None, exactly like a stale one; a lease that left with its run
        is refused MOVED (``refuse_if_forwarded``)."""
        lease = self.leases.get(handle)
        if lease is None or lease.tenant != self.tenants.of(conn):
            if self.forwarded.runs:  # (only on a miss, only after a move)
                self.refuse_if_forwarded(handle, self.tenants.of(conn))
            return None
        return lease

    def forwarded_run(self, handle: bytes, tenant: str) -> str | None:
        """The run ``handle``, no live lease here, left this shard with (forwarded.py),
        if it is ``tenant``'s and the run is not here again (moved back: then the handle
        is merely stale)."""
        run = self.forwarded.run_of(handle, tenant)
        return None if run is None or (tenant, run) in self.scopes else run

    def refuse_if_forwarded(self, handle: bytes, tenant: str) -> None:
        """MOVED if ``handle`` is ``tenant``'s lease that left with its run on a slot
        move (forwarded.py): the request was not executed, and its SDK takes the lease
        to the run's new shard. The details name the run; the shell, which holds the
        slot map, answers with where its slot is now (``SlotOwner.moved``)."""
        run = self.forwarded_run(handle, tenant)
        if run is not None:
            raise CoreError(
                ErrorCode.MOVED,
                f"lease {handle.hex()} moved with run {run!r} to another shard: the "
                "request was not executed; send it to the shard that owns the run's slot",
                {"scope": run},
            )

    # ---- scopes ----------------------------------------------------------------------

    def tenant_of(self, conn: int) -> str:
        """The tenant of connection ``conn``: what every object it makes belongs to."""
        return self.tenants.of(conn)

    def scope_for(self, tenant: str, scope_id: str) -> Scope:
        """For records (live and replayed): the scope, made if missing. Checks no limit:
        a live record only names a run its op found with ``run`` (or SCOPE_CREATE
        made); replay of an older journal may name a run that was made by first use."""
        scope = self.scopes.get((tenant, scope_id))
        if scope is None:
            tenant = self.tenants.name(tenant)
            scope = self.scopes[(tenant, scope_id)] = Scope(tenant, scope_id, None)
            self.tenants.of_tenant(tenant).runs += 1
            pages = self.scope_pages.get(tenant)
            if pages is None:
                pages = self.scope_pages[tenant] = PagedIndex(self._scope_alive)
            pages.add(scope)
            if self.slot_count:
                self._index_run(scope)
        return scope

    def run(self, tenant: str, scope_id: str) -> Scope:
        """For every request that names a run: the run, which must exist (made by
        SCOPE_CREATE, or recovered). A run id never created, or another tenant's, is
        NOT_FOUND: one dict lookup, and a mistyped id never becomes an empty run."""
        scope = self.scopes.get((tenant, scope_id))
        if scope is None:
            raise CoreError(
                ErrorCode.NOT_FOUND,
                f"run {scope_id!r} does not exist; create it first "
                "(SCOPE_CREATE, rs.scopes.create)",
                {"scope": scope_id},
            )
        return scope

    def holding_run(self, tenant: str, scope_id: str) -> Scope | None:
        """For a take of a tenant's shared capacity (a pool slot, a quota amount), which
        lives on the shard of its name, not of the run (poolbook.py): the run it is
        for, which must exist if its slot is this shard's (``run``: NOT_FOUND else), or
        None for a run of another shard, which this one cannot see (a copy left here by
        a move cut short included: it is dropped soon): the hold is then tied to nothing
        of the run here (it ends with its lease)."""
        if not self.homes_run(scope_id):
            return None
        return self.run(tenant, scope_id)

    def find_scope(self, tenant: str, scope_id: str) -> Scope | None:
        """For reads: the scope if it exists; creates nothing."""
        return self.scopes.get((tenant, scope_id))

    def release_scope(self, scope: Scope) -> None:
        """Called wherever a run may have emptied. O(1). A run made by first use in an
        older journal (never created, not cancelled) that holds nothing is freed at once
        (replay only: ``Core.recovered`` turns every such run left into a created one);
        any other run that holds nothing is announced (``run_emptied``), once until
        it is armed: runends.py starts its quiet window."""
        if not scope.holds_nothing() or self.scopes.get(scope.key) is not scope:
            return
        if scope.created_at is None and scope.cancelled is None:
            self.drop_scope(scope)
        elif scope.quiet != QUEUED:  # emptied, or emptied again: ``RunEnds.arm``
            scope.quiet = QUEUED
            for heard in self.events.run_emptied.listeners:  # (as ``Signal.__call__``)
                heard(scope)

    def drop_scope(self, scope: Scope) -> None:
        """Take a run that holds nothing out of the table and its tenant's count."""
        del self.scopes[scope.key]
        scope.quiet = IDLE
        self.tenants.of_tenant(scope.tenant).runs -= 1
        self.scope_pages[scope.tenant].removed()
        if self.slot_count:
            slot = slot_of(scope.id, self.slot_count)
            runs = self.runs_by_slot[slot]
            del runs[scope.key]
            if not runs:
                del self.runs_by_slot[slot]

    def index_slots(self, slots: int) -> None:
        """Keep the runs of each of ``slots`` slots from now on (a node of a sharded
        cluster, before it serves): one walk over the runs now, then one CRC-32 of the
        run id and one dict insert per run made, one delete per run freed."""
        self.slot_count = slots
        self.runs_by_slot = {}
        for scope in self.scopes.values():
            self._index_run(scope)

    def _index_run(self, scope: Scope) -> None:
        slot = slot_of(scope.id, self.slot_count)
        runs = self.runs_by_slot.get(slot)
        if runs is None:
            runs = self.runs_by_slot[slot] = {}
        runs[scope.key] = scope

    def _scope_alive(self, scope: Scope) -> bool:
        return self.scopes.get(scope.key) is scope
