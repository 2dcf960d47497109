"""Capacity held from another shard: a task whose ``needs`` name pools or quotas homed on
another shard of the cluster is delivered only while its shard holds a grant of them
from that shard (issue 32).

The contract (docs/cluster.md, "Scaling out: shards"):
- a task may need pools and quotas of its run's own shard (needs.py, blocked.py: taken
  here at delivery, as on a server alone) or of exactly one other shard (this module);
  needs that mix the two, or name two other shards, are INVALID_ARGUMENT at the submit
  (the shell's rule: it alone knows the map; the core's ``parse_needs`` refuses a mix
  of this shard's names and others');
- a task needing another shard's capacity is delivered only while its shard holds a
  grant from that shard: one slot of each pool and each quota amount, taken there all
  at once (nothing held partly) under that shard's own rules, so a pool's limit and a
  quota's rate hold across shards, counted in one place;
- the grant is journaled here (GRANT_HELD) before the delivery it allows begins, tied to
  that delivery, and given back when the delivery ends, however it ends. Each delivery
  needs a grant of its own, as a delivery needs its own slots and quota on one shard;
- an ask names its grant by a hold key (the shard, the item and the grant's number
  ``seq``, one more than the item's last grant): the same ask sent again (a lost reply,
  a new primary after a takeover) is answered the same grant by the pool's shard, so a
  quota is never spent twice for one grant; a grant that lapsed or was used is never
  asked for again under its key;
- a grant is a lease of the pool's shard: the shell renews every grant of ``held`` (a
  new primary renews the ones it replayed); a grant that lapsed (its shard answered its
  renewal STALE_CLAIM) ends the delivery it allows as a lost lease does (the item goes
  back to its queue, the attempt counts; LEASE_LOST to its worker), or, not yet
  delivered, is dropped (GRANT_ENDED) and asked for again;
- an item waiting for a grant is blocked (its queue's ``blocked`` counts it) and does
  not hold up the items behind it;
- an ask that its shard had already and will never grant (a grant delivered to an old
  primary's connection, lost with it, which lapses there) is abandoned once that is
  known (``abandon``: GRANT_ENDED), and the item asks for the next number;
- needs of another shard are served for the default tenant only (needs.py: the shard
  asks with the cluster token).

How an item goes: ``Blocked.pop`` meets a ready item whose needs are elsewhere
(``elsewhere``): with a grant held it is delivered; without, it is taken off its line
and asked for (``ask``: an entry in ``asks``, which the shell drains; nothing else is
written); the shell's answer comes back through the Core (``Core.grant_held`` then
``held``: GRANT_HELD, and the item is offered to its queue as an unblocked item is).
A grant the pool's shard refuses (its pool or quota does not exist there, an amount
over the limit) leaves the item asking: the shell asks again later, as a local item
needing more than a quota's limit waits until the limit is raised.

Asks are live state only (a new primary asks again, with the same keys, when its
first receive meets the items); grants are records, replayed on standbys, so the one
that takes over renews them. The shell learns which grants ended (to release them on
their shard) from ``held`` itself: it compares the handles it renews with ``held``
whenever ``changes`` moved, so appliers emit nothing. A grant whose delivery ended
when the old primary died before releasing it is not in the new primary's ``held``:
its lease on the pool's shard lapses within one grant lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..records import Rec
from ..records.itemrecords import GrantEnded, GrantHeld
from ..records.snaprecords import SnapGrant
from ..run.items import Item
from ..state.tables import Applier, Tables
from .workbook import Work

__all__ = ["Ask", "Grant", "Grants"]


class Grant:
    """A grant an item holds: its number, its lease handle on the pool's shard, and the
    lease length the shell renews it for."""

    __slots__ = ("handle", "length", "seq")

    def __init__(self, seq: int, handle: bytes, length: float) -> None:
        self.seq = seq
        self.handle = handle
        self.length = length


class Ask:
    """What the shell asks the other shard for: grant ``seq`` of item ``item_id`` of
    ``tenant``, one slot of each of ``pools`` and each of ``quotas`` (name, amount)."""

    __slots__ = ("item_id", "pools", "quotas", "seq", "tenant")

    def __init__(self, tenant: str, item_id: str, seq: int, pools: tuple[str, ...],
                 quotas: tuple[tuple[str, int], ...]) -> None:
        self.tenant = tenant
        self.item_id = item_id
        self.seq = seq
        self.pools = pools
        self.quotas = quotas


class Grants:
    """The grants items hold from other shards, the items asking for one, and the asks
    the shell has not taken yet. Owned by Blocked (blocked.py)."""

    def __init__(self, tables: Tables, work: Work) -> None:
        self.tables = tables
        self.work = work
        self.held: dict[str, Grant] = {}  # item id -> the grant it holds now
        self.seqs: dict[str, int] = {}  # item id -> its last grant's number (0: none)
        self.asking: dict[str, Item] = {}  # items off their line, waiting for a grant
        self.asks: list[Ask] = []  # new asks, drained by the shell (live only)
        # Moves whenever ``held`` loses a grant (the shell releases it) or an item asking
        # ends (the shell cancels its ask).
        self.changes = 0
        self.appliers: dict[int, Applier] = {
            Rec.GRANT_HELD: self.apply_held, Rec.GRANT_ENDED: self.apply_ended,
            Rec.SNAP_GRANT: self.apply_snapshot,
        }

    # ---- asking ---------------------------------------------------------------------

    def ask(self, item: Item) -> None:
        """``item`` is ready but holds no grant: ask the shell for the next one (once:
        an item already asking is not asked for again)."""
        if item.id in self.asking:
            return
        self.asking[item.id] = item
        needs = item.needs
        assert needs is not None
        self.asks.append(Ask(item.tenant, item.id, self.seqs.get(item.id, 0) + 1,
                             needs.pools, needs.quotas))

    def take_asks(self) -> list[Ask]:
        out, self.asks = self.asks, []
        return out

    def pending_asks(self) -> list[Ask]:
        """Every ask still unanswered, as first made (the shell asks again after its
        connection to the other shard failed)."""
        out = []
        for item in self.asking.values():
            needs = item.needs
            assert needs is not None
            out.append(Ask(item.tenant, item.id, self.seqs.get(item.id, 0) + 1,
                           needs.pools, needs.quotas))
        return out

    def held_for(self, item: Item) -> bool:
        return item.id in self.held

    def granted(self, now: float, item_id: str, seq: int, handle: bytes,
                length: float) -> tuple[bool, Item | None]:
        """The shell's answer to an ask: GRANT_HELD, and the item that may now be offered
        to its queue (False: the answer is stale, the item ended or holds a grant, and
        the shell releases ``handle`` itself). A pending item that is not asking takes
        the grant too: a new primary's shell may hear of an ask its old primary made
        before the item is met on its line again."""
        asking = self.asking.pop(item_id, None)
        item = asking or self.work.items.get(item_id)
        if item is None or item.terminal or item.delivery is not None \
                or item_id in self.held or seq != self.seqs.get(item_id, 0) + 1:
            if asking is not None:
                self.asking[item_id] = asking
            return False, None
        self.tables.commit(GrantHeld(Rec.GRANT_HELD, item_id, seq, handle, length), now)
        # An item not asking is on its line: it takes the grant when it is met there.
        return True, asking

    def abandon(self, now: float, item_id: str, seq: int) -> bool:
        """Ask ``seq`` of ``item_id`` will never be granted (its shard answered that it
        had it already, and no grant came within two grant leases: a grant the old
        primary took and lost in a takeover, which lapses there): GRANT_ENDED, and the
        item asks for ``seq`` + 1. False if the ask is no longer that."""
        item = self.asking.get(item_id)
        if item is None or item_id in self.held or seq != self.seqs.get(item_id, 0) + 1:
            return False
        self.tables.commit(GrantEnded(Rec.GRANT_ENDED, item_id, seq, "abandoned"), now)
        del self.asking[item_id]
        self.ask(item)
        return True

    def lapsed(self, now: float, item: Item) -> None:
        """The grant ``item`` holds lapsed before a delivery used it: GRANT_ENDED (its
        next ask is a new grant)."""
        grant = self.held.get(item.id)
        if grant is not None:
            self.tables.commit(GrantEnded(Rec.GRANT_ENDED, item.id, grant.seq, "lapsed"), now)

    def item_of(self, handle: bytes) -> Item | None:
        """The item holding the grant ``handle``, if any. O(grants held): rare (a lapse)."""
        for item_id, grant in self.held.items():
            if grant.handle == handle:
                return self.work.items.get(item_id)
        return None

    # ---- appliers and the ends of deliveries and items -------------------------------

    def apply_held(self, rec: GrantHeld, now: float) -> None:
        _, item_id, seq, handle, length = rec
        item = self.work.items.get(item_id)
        if item is None or item.terminal or seq <= self.seqs.get(item_id, 0):
            return  # replayed again, or its item ended meanwhile
        self.seqs[item_id] = seq
        self.held[item_id] = Grant(seq, handle, length)

    def apply_ended(self, rec: GrantEnded, now: float) -> None:
        _, item_id, seq, _ = rec
        item = self.work.items.get(item_id)
        if item is None or item.terminal:
            return
        self.seqs[item_id] = max(self.seqs.get(item_id, 0), seq)  # never asked again
        grant = self.held.get(item_id)
        if grant is not None and grant.seq == seq:
            self._drop(item_id)

    def delivery_ended(self, item: Item) -> None:
        """The delivery that used ``item``'s grant ended (an applier): the grant ends."""
        if item.id in self.held:
            self._drop(item.id)

    def forget(self, item: Item) -> None:
        """``item`` ended (an applier): its grant, ask and count go."""
        if self.asking.pop(item.id, None) is not None:
            self.changes += 1
        self.seqs.pop(item.id, None)
        if item.id in self.held:
            self._drop(item.id)

    def _drop(self, item_id: str) -> None:
        del self.held[item_id]
        self.changes += 1

    # ---- snapshots -------------------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """A SNAP_GRANT for each item with a grant count (after every SNAP_ITEM)."""
        for item_id, seq in self.seqs.items():
            grant = self.held.get(item_id)
            yield SnapGrant(Rec.SNAP_GRANT, item_id, seq,
                            None if grant is None else grant.handle,
                            0.0 if grant is None else grant.length)

    def apply_snapshot(self, rec: SnapGrant, now: float) -> None:
        _, item_id, seq, handle, length = rec
        if item_id not in self.work.items:
            return
        self.seqs[item_id] = seq
        if handle is not None:
            self.held[item_id] = Grant(seq, handle, length)
