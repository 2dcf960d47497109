"""The id counters' records: reserving blocks of ids before use, jumping them after a
crash or a takeover, and their snapshot (the rules of ids.py's counters).

What always holds:
- a block of ids is reserved by an IDS_RESERVED record made durable before any reply of
  the batch that needed it (``Effects.sync``), checked at the end of every request and
  tick (``reserve_if_due``: one comparison per counter, ids.py);
- after an unclean stop or a takeover (``jump``, an IDS_JUMPED record) every counter moves
  to its durable ceiling and every next grant's generation above anything that could
  have been granted without this core recording it (claims and pools alike); what is
  held through it keeps its holder's generation;
- a snapshot starts with the counters (SNAP_COUNTERS, SNAP_ID_COUNTERS), so the records
  after them are applied with every counter already in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .holds.claimbook import ClaimBook
from .holds.poolbook import PoolBook
from .records import IdsJumped, IdsReserved, Rec
from .records.snaprecords import SnapCounters, SnapIdCounters
from .state.tables import Applier, Handler, Tables
from .work.workbook import Work

__all__ = ["IdBook"]


class IdBook:
    """IDS_RESERVED, IDS_JUMPED and the counters' snapshot records. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, claims: ClaimBook, pools: PoolBook) -> None:
        self.tables = tables
        self.ids = tables.ids
        self.lease_ids = tables.leases.ids
        self.item_ids = work.item_ids
        self.claims = claims
        self.pools = pools
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {
            Rec.IDS_RESERVED: self.ids.apply_reserved,
            Rec.IDS_JUMPED: self.apply_jumped,
            Rec.SNAP_COUNTERS: self.apply_counters,
            Rec.SNAP_ID_COUNTERS: self.apply_id_counters,
        }

    def reserve_if_due(self, now: float) -> None:
        """The next block, if a counter is past its mark (end of a request or tick)."""
        rec = self.ids.needed(self.lease_ids.top, self.item_ids.top)
        if rec is not None:
            self._reserve(rec, now)

    def reserve(self, now: float) -> None:
        """The next block now (before serving)."""
        self._reserve(self.ids.next_block(self.lease_ids.top, self.item_ids.top), now)

    def _reserve(self, rec: IdsReserved, now: float) -> None:
        self.tables.effects.sync = True  # durable before any reply of this batch
        self.tables.commit(rec, now)

    def reserve_from(self, floor: int) -> None:
        """After a repair: move the id ceilings to at least ``floor`` (a record)."""
        rec = IdsReserved(
            Rec.IDS_RESERVED,
            max(floor, self.ids.lease_ceiling),
            max(floor, self.ids.item_ceiling),
        )
        self.tables.commit(rec, 0.0)  # its applier does not read ``now``

    def jump(self, now: float) -> None:
        """After an unclean stop or a takeover: an IDS_JUMPED record. (A tenant's keys
        lost at most the grants its own counter lost: every counter is at the floor or
        above.)"""
        delta = max(0, self.ids.lease_ceiling - self.lease_ids.floor)
        self.tables.commit(IdsJumped(Rec.IDS_JUMPED, delta), now)

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        ids, leases, items = self.ids, self.lease_ids, self.item_ids
        yield SnapCounters(Rec.SNAP_COUNTERS, leases.floor, items.floor,
                           ids.lease_ceiling, ids.item_ceiling, ids.generation_floor,
                           ids.jumped_to)
        yield SnapIdCounters(Rec.SNAP_ID_COUNTERS, dict(leases.next), dict(items.next))

    # ---- records ---------------------------------------------------------------------

    def apply_jumped(self, rec: IdsJumped, now: float) -> None:
        delta = rec[1]
        self.lease_ids.jump(self.ids.lease_ceiling)
        self.item_ids.jump(self.ids.item_ceiling)
        self.claims.jump_generations(delta)
        self.pools.jump_generations(delta)

    def apply_counters(self, rec: SnapCounters, now: float) -> None:
        # next_lease, next_item: where a counter not in SNAP_ID_COUNTERS starts (in files
        # before per-tenant counters, the one counter: every tenant goes on above it)
        _, next_lease, next_item, lease_ceiling, item_ceiling, floor, jumped_to = rec
        self.lease_ids.jump(next_lease)
        self.item_ids.jump(next_item)
        self.ids.apply_reserved(IdsReserved(Rec.IDS_RESERVED, lease_ceiling, item_ceiling), now)
        self.ids.generation_floor = max(self.ids.generation_floor, floor)
        self.ids.jumped_to = max(self.ids.jumped_to, jumped_to)

    def apply_id_counters(self, rec: SnapIdCounters, now: float) -> None:
        _, leases, items = rec
        for tenant, number in leases.items():
            self.lease_ids.took(tenant, number - 1)
        for space, number in items.items():
            self.item_ids.took(space, number - 1)
