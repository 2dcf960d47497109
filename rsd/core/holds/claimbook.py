"""Claims: exclusive ownership of a key inside a scope, held by a lease.

What always holds:
- a claim has at most one live lease, and is that lease itself while held (one object
  per held key, claim.py), taking a new handle at each grant; its ``generation`` grows
  strictly with each new owner and never goes back or repeats: a grant gives the key's
  generation plus one, or the last jump's floor plus one if that is higher
  (``next_generation``: a key held through a jump keeps its holder's generation, ids.py);
- a claim exists only while its key is held (waiters exist only then too): when its
  lease ends and nobody waits, the Claim is freed, so memory follows held keys. What a
  freed key's generation needs survives in one number, ``Ids.generation_floor``, raised
  to the generation of every lease that ends: a key not in the table starts from the
  floor, so its next grant is above anything it had. Raising it on every end (not only
  on a free) keeps a live core and its replay equal (waiters are not journaled);
- the fencing token is the lease handle (leases.py): renew and release need the current
  one, presented whole by a connection of the claim's tenant; anything else is
  STALE_CLAIM;
- a claim belongs to its scope's tenant, and a new key counts against that tenant's
  ``claims`` limit (tenants.py) while it is in the table;
- waiters queue FIFO per key and exist only while the key is held: the moment the lease
  ends (release or expiry) the first waiter still waiting is granted, in the same call,
  and told by the deferred reply to its acquire request;
- a waiter is a Wait (see waits.py): it ends when granted, when its timeout passes
  (WAIT_TIMEOUT), when the client cancels it (CANCELLED) or when its connection closes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..ground.effects import DEFERRED
from ..ground.errors import CoreError
from ..ground.leases import NO_CONN, lease_id_of
from ..ground.pages import PagedIndex
from ..ground.validate import lease_seconds, opt_bool, opt_number, req_handle, req_text
from ..ground.waits import WaitLine
from ..records import ClaimGranted, LeaseEnded, Rec
from ..records.snaprecords import SnapClaim
from ..run.claim import Claim, Waiter, grant_view
from ..run.scope import Scope
from ..state.tables import Applier, Handler, Tables

__all__ = ["DEFERRED", "Claim", "ClaimBook", "Waiter", "grant_view"]


class ClaimBook:
    """The claim rules. Owned by the Core, which hands it the shared tables."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.ids = tables.ids
        self.leases = tables.leases
        self.waits = tables.waits
        self.effects = tables.effects
        self.count = 0  # claims in the table: held keys (a counter, for stats)
        self.ops: dict[int, Handler] = {
            Op.CLAIM_ACQUIRE: self.acquire,
            Op.CLAIM_RELEASE: self.release,
            Op.CLAIM_INSPECT: self.inspect,
        }
        self.appliers: dict[int, Applier] = {
            Rec.CLAIM_GRANTED: self.apply_granted,
            Rec.LEASE_ENDED: self.apply_ended,
            Rec.SNAP_CLAIM: self.apply_snapshot,
        }

    # ---- ops -------------------------------------------------------------------------

    def acquire(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        key = req_text(args, "key", Limits.MAX_KEY_BYTES)
        length = lease_seconds(args, self.tables.min_lease_seconds)
        wait = opt_bool(args, "wait", False)
        bound = opt_bool(args, "release_on_disconnect", False)
        timeout_ms = opt_number(
            args, "timeout_ms", Limits.DEFAULT_WAIT_TIMEOUT_MS, 0, Limits.MAX_WAIT_TIMEOUT_MS
        )
        tables = self.tables
        holder = tables.holders.get(conn, "")
        tenant = tables.tenant_of(conn)
        scope = tables.run(tenant, scope_id)
        scope.refuse_if_cancelled()
        claim = scope.claims.get(key)
        if claim is None:
            tables.tenants.room(tenant, "claims")
            claim = self._new_claim(scope, key, self.ids.generation_floor)
        if claim.handle is None:
            self._grant(now, conn, claim, holder, length, bound)
            return grant_view(claim, claim.generation)
        if not wait:
            raise CoreError(
                ErrorCode.CLAIM_HELD,
                f"claim {key!r} in scope {scope_id!r} is held by {claim.holder!r}",
                {"holder": claim.holder, "generation": claim.generation},
            )
        if timeout_ms == 0:
            raise CoreError(ErrorCode.WAIT_TIMEOUT, f"claim {key!r} is held; timeout_ms is 0")
        if len(claim.waiters) >= Limits.MAX_WAITERS_PER_KEY:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"claim {key!r} already has {Limits.MAX_WAITERS_PER_KEY} waiters, the limit",
            )
        waiter = Waiter(
            claim, conn, rid, holder, length, now + timeout_ms / 1000.0, now, bound
        )
        if not claim.waiters:
            claim.waiters = WaitLine()
        claim.waiters.append(waiter)
        self.waits.add(waiter)
        return DEFERRED

    def release(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        self._end(now, self._current(conn, req_handle(args)), "released")
        return {}

    def inspect(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        key = req_text(args, "key", Limits.MAX_KEY_BYTES)
        scope = self.tables.run(self.tables.tenant_of(conn), scope_id)
        claim = scope.claims.get(key)
        if claim is None:
            # Free (or freed): no smaller than any generation it had, below the next one.
            floor = self.ids.generation_floor
            return {"held": False, "generation": floor, "holder": None, "waiters": 0}
        held = claim.handle is not None
        return {
            "held": held,
            "generation": claim.generation if held else self.next_generation(claim) - 1,
            "holder": claim.holder if held else None,
            "waiters": len(claim.waiters),
        }

    # ---- events ----------------------------------------------------------------------

    def expired(self, now: float, claim: Claim, reason: str = "expired") -> None:
        """``lease_expired``: the claim's lease ran out, or (``reason`` "connection
        closed") the connection it was bound to closed: it ends, its waiter gets it."""
        generation, lease_id, holder = claim.generation, claim.id, claim.holder
        self._end(now, claim, reason, lost=True)
        taken = claim.handle is not None  # by a waiter, under a lease of its own
        self.effects.note(
            "claim lease expired" if reason == "expired" else "claim lease ended with its "
            "connection", scope=claim.scope, key=claim.key, lease=lease_id,
            holder=holder, generation=generation,
            taken_over_by=claim.holder if taken else None,
            new_lease=claim.id if taken else None,
        )

    def cancel_slice(self, now: float, scope: Scope, claims: Iterable[Claim]) -> int:
        """A run was cancelled: for ``claims``, a slice of the run's, the waiters are
        refused and the held claims end. Returns how many held claims ended."""
        count = 0
        message = scope.cancelled_message()
        for claim in claims:  # ending a lease frees its claim
            for waiter in list(claim.waiters):
                self.waits.end(waiter, ErrorCode.SCOPE_CANCELLED, message)
            handle = claim.handle
            if handle is not None:
                # No waiter is granted: they were all refused just above. (Its holder is
                # told first: the record's applier takes the handle off the claim.)
                self.effects.lease_lost(claim, "scope cancelled")
                self.tables.commit(LeaseEnded(Rec.LEASE_ENDED, handle, "scope cancelled"), now)
                count += 1
        return count

    # ---- records ---------------------------------------------------------------------

    def apply_granted(self, rec: ClaimGranted, now: float) -> Any:
        _, scope_id, key, handle, generation, holder, length, tenant, bound = rec
        existing = self.leases.get(handle)
        if existing is not None:
            return existing
        if self.leases.ids.seen(tenant, lease_id_of(handle)):
            return None  # an ended lease replayed again: its end record follows or preceded
        scope = self.tables.scope_for(tenant, scope_id)
        claim = scope.claims.get(key)
        if claim is None:
            claim = self._new_claim(scope, key, self.ids.generation_floor)
        if claim.handle is None:
            scope.held_claims += 1
        else:  # granted again while the grant before is live (not written so): it ends
            self.leases.end(claim)
            ids = self.ids
            ids.generation_floor = max(ids.generation_floor, claim.generation)
        if claim.generation < generation:
            claim.generation = generation
        self.leases.hold(claim, handle, holder, NO_CONN, length, now)
        if bound:
            self.leases.bind(claim, NO_CONN)  # to its connection: by ``_grant``, live
        return claim

    def apply_ended(self, rec: LeaseEnded, now: float) -> Claim | None:
        claim = self.leases.get(rec[1])
        if type(claim) is not Claim:
            return None
        self.leases.end(claim)
        ids = self.ids
        if ids.generation_floor < claim.generation:
            ids.generation_floor = claim.generation
        claim.handle = None  # type: ignore[assignment]
        scope = self.tables.find_scope(claim.tenant, claim.scope)
        if scope is not None:
            scope.held_claims -= 1
        if not claim.waiters:
            self.free(claim)
        return claim

    # ---- snapshots and crashes -------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """One SNAP_CLAIM per held key (a key nobody holds is not kept; the counters
        record carries the generation floor)."""
        for scope in self.tables.scopes.values():
            yield from self.run_snapshot(scope)

    def run_snapshot(self, scope: Scope) -> Iterator[SnapClaim]:
        """One SNAP_CLAIM per held key of ``scope`` (a snapshot's, a moved run's)."""
        bound = self.leases.bound
        for claim in scope.claims.values():
            if claim.handle is not None:
                yield SnapClaim(Rec.SNAP_CLAIM, scope.id, claim.key, claim.generation,
                       claim.handle, claim.holder, claim.length, scope.tenant,
                       claim.handle in bound)

    def apply_snapshot(self, rec: SnapClaim, now: float) -> None:
        _, scope_id, key, generation, handle, holder, length, tenant, bound = rec
        if handle is None:
            # A free key (older snapshots kept them): only its generation matters, and
            # the floor keeps that.
            ids = self.ids
            ids.generation_floor = max(ids.generation_floor, generation)
            return
        scope = self.tables.scope_for(tenant, scope_id)
        claim = scope.claims.get(key)
        if claim is None:
            claim = self._new_claim(scope, key, generation)
        claim.generation = max(claim.generation, generation)
        if claim.handle is None and self.leases.get(handle) is None:
            self.leases.hold(claim, handle, holder, NO_CONN, length, now)
            if bound:
                self.leases.bind(claim, NO_CONN)
            scope.held_claims += 1

    def jump_generations(self, delta: int) -> None:
        """After an unclean stop or a takeover (IDS_JUMPED): at most ``delta`` grants
        were lost, each one above the highest generation known (floor and held keys) by
        at most one more than the one before; so the next grant of every key, held or
        not, goes above that highest one plus ``delta`` (``Ids.jumped_to``). A held key
        keeps its holder's generation. O(held keys), once per recovery."""
        ids = self.ids
        top = ids.generation_floor  # (never below jumped_to: it only grows)
        for scope in self.tables.scopes.values():
            for claim in scope.claims.values():
                top = max(top, claim.generation)
        ids.generation_floor = ids.jumped_to = top + delta

    def next_generation(self, claim: Claim) -> int:
        """The generation of ``claim``'s next grant: its last owner's plus one, and
        above the last jump's floor (a key held through it kept its holder's)."""
        generation = claim.generation
        jumped_to = self.ids.jumped_to
        return (generation if generation > jumped_to else jumped_to) + 1

    # ---- internals -------------------------------------------------------------------

    def _new_claim(self, scope: Scope, key: str, generation: int) -> Claim:
        claim = scope.claims[key] = Claim(scope.tenant, scope.id, key, generation)
        self.count += 1
        pages = scope.claim_pages
        if pages is None:
            claims = scope.claims
            pages = scope.claim_pages = PagedIndex(lambda c: claims.get(c.key) is c)
        pages.add(claim)
        self.tables.tenants.of_tenant(scope.tenant).claims += 1
        return claim

    def free(self, claim: Claim) -> None:
        """Forget a key nobody holds or waits for (its generation is in the floor)."""
        scope = self.tables.find_scope(claim.tenant, claim.scope)
        if scope is not None and scope.claims.get(claim.key) is claim:
            del scope.claims[claim.key]
            self.count -= 1
            if scope.claim_pages is not None:
                scope.claim_pages.removed()
            self.tables.tenants.of_tenant(claim.tenant).claims -= 1
            self.tables.release_scope(scope)

    def _current(self, conn: int, handle: bytes) -> Claim:
        """The held claim with this handle, of ``conn``'s tenant; STALE_CLAIM for
        anything else (one message, whatever the reason, so a refusal tells nothing)."""
        lease = self.tables.own_lease(conn, handle)
        if type(lease) is not Claim:
            raise CoreError(
                ErrorCode.STALE_CLAIM,
                f"lease {handle.hex()} is not current: it expired, was released or never "
                "existed",
            )
        return lease

    def _grant(
        self, now: float, conn: int, claim: Claim, holder: str, length: float, bound: bool
    ) -> None:
        """Grant ``claim`` to ``holder`` on ``conn`` (``bound``: until that connection
        closes at the latest)."""
        rec = ClaimGranted(
            Rec.CLAIM_GRANTED, claim.scope, claim.key, self.tables.new_lease_handle(claim.tenant),
            self.next_generation(claim), holder, length, claim.tenant, bound,
        )
        granted = self.tables.commit(rec, now)
        assert granted is claim
        claim.conn = conn
        if bound:
            self.leases.bind(claim, conn)

    def _end(self, now: float, claim: Claim, reason: str, *, lost: bool = False) -> None:
        """End a claim's lease (a LEASE_ENDED record; LEASE_LOST pushed to its holder if
        ``lost``) and grant the key to the first waiter still waiting."""
        if lost:  # (first: the record's applier takes the handle off the claim)
            self.effects.lease_lost(claim, reason)
        ended = self.tables.commit(LeaseEnded(Rec.LEASE_ENDED, claim.handle, reason), now)
        if ended is None:
            return
        waiters = claim.waiters
        if waiters:
            assert isinstance(waiters, WaitLine)
            waiter = waiters.popleft()
            assert isinstance(waiter, Waiter)
            if not waiters:
                claim.waiters = ()
            self.waits.served(waiter)
            self._grant(now, waiter.conn, claim, waiter.holder, waiter.length, waiter.bound)
            self.effects.reply(
                waiter.conn,
                waiter.request_id,
                grant_view(claim, claim.generation, now - waiter.since),
            )
