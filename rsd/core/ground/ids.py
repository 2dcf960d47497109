"""Identifiers that must never repeat: fencing tokens, item ids and generations.

Lease ids (the fencing tokens) and item ids come from counters that only grow, one per
tenant (``Counters``): a tenant's ids move only with its own activity, so the ids it is
given tell it nothing of other tenants' rates. Lease ids are unique per tenant (a
handle adds 64 random bits, and is unique among live leases); item ids are unique on
the server: the default tenant's are ``t-N`` / ``m-N``, another tenant's carry its name,
``t-N.acme`` (``item_id``), so each tenant counts in a namespace of its own. The
counters' keys are the tenant (leases) and that namespace (items; an id of a file
written before per-tenant counters has the plain form whatever its tenant, and counts
in the default's namespace, so no id is ever given twice).

In a sharded cluster each shard counts in namespaces of its own (``Counters.shard``,
set from the shard's name): its ids end ``@SHARD`` (``t-7.@s2``, ``t-7.acme@s2``), so two
shards never give the same id, and a run moved from one shard to another (transfer.py)
keeps its items' ids without meeting the target's. The counters of a namespace only
grow on every shard that ever held one of its ids (an import takes the ids it brings),
so an id is never given twice even when slots move back and forth. A server alone,
and every id of an older journal, keeps today's form.

Every counter may hand out ids only below one ceiling shared by all (per kind) that is
already on disk: when the highest counter comes near it, the core reserves the next
block with an IDS_RESERVED record and marks the batch as needing an fsync before its
replies leave, whatever the fsync policy. So after any crash, under any policy, every
id a client may have seen is below a durable ceiling, and recovery restarts every
counter there (a counter not yet drawn from starts at the ``floor``, which moves with
it).

A key's generation grows strictly with each new owner (a grant gives its generation
plus one) and never repeats, but need not grow by one: a key nobody holds is forgotten
(claimbook.py), and ``generation_floor``, the highest generation of any lease that ended,
is where a key not in the table starts again. A crash under ``everysec`` or ``no`` can
lose the records of recent grants: each took a lease id, so at most ``lease_ceiling -
next_lease`` of them (``delta``), each at most one above the highest generation before
it. After an unclean stop (or a takeover) the next grant of every key, held or not,
therefore goes above the highest generation known plus ``delta`` (IDS_JUMPED): the
floor moves there, and so does ``jumped_to``, which no grant of a key goes below. A key
held through the jump keeps its holder's generation (what its holder was told, and
what CLAIM_INSPECT and FENCE_CHECK say while it holds), as a pool's slots keep theirs.
Generations may jump; never go back.
"""

from __future__ import annotations

from typing import Any, Final

from ..records import IdsReserved, Rec

__all__ = ["BLOCK", "Counters", "Ids", "item_id", "item_number"]

BLOCK = 4096  # ids reserved per IDS_RESERVED record
_MARGIN = 256  # reserve again when fewer than this many ids are left
_PLAIN: Final = "default"  # the tenant whose item ids have the plain form (DEFAULT_TENANT)


class Counters:
    """Counters that only grow, one per key (a tenant, an item namespace), each starting
    at ``floor``; ``top`` is the highest next value of any (the ceiling's concern).
    ``next`` holds only counters above the floor, so that equal states are equal."""

    __slots__ = ("floor", "next", "shard", "top")

    def __init__(self) -> None:
        self.floor = 1
        self.next: dict[str, int] = {}
        self.top = 1
        self.shard = ""  # "@NAME" on a shard of a sharded cluster (new item ids only)

    def peek(self, key: str) -> int:
        """The next id of ``key``; taken when the record that uses it is applied."""
        return self.next.get(key, self.floor)

    def seen(self, key: str, number: int) -> bool:
        """Whether ``number`` of ``key`` was already taken (a record replayed again)."""
        return number < self.next.get(key, self.floor)

    def take(self, key: str, number: int) -> bool:
        """Take ``number`` of ``key``; False if it was taken already (``seen``: a record
        replayed again), and then nothing changes."""
        if number < self.next.get(key, self.floor):
            return False
        self.next[key] = number + 1
        if number >= self.top:
            self.top = number + 1
        return True

    def new_item_id(self, prefix: str, tenant: str) -> str:
        """``tenant``'s next item id, in its namespace ("" for the default tenant, else
        its name; see ``item_id``; then ``@SHARD`` in a sharded cluster); taken when its
        record is applied."""
        space = ("" if tenant == _PLAIN else tenant) + self.shard
        return item_id(prefix, space, self.next.get(space, self.floor))

    def took(self, key: str, number: int) -> None:
        if number >= self.next.get(key, self.floor):
            self.next[key] = number + 1
            if number >= self.top:
                self.top = number + 1

    def jump(self, to: int) -> None:
        """Every counter, and the floor, to at least ``to`` (after an unclean stop)."""
        if to <= self.floor:
            return
        self.floor = to
        for key in [key for key, number in self.next.items() if number <= to]:
            del self.next[key]
        self.top = max(self.top, to)


def item_id(prefix: str, space: str, number: int) -> str:
    """Item ``number`` of namespace ``space``: ``t-7`` (""), ``t-7.acme`` ("acme")."""
    return f"{prefix}-{number}.{space}" if space else f"{prefix}-{number}"


def item_number(item: str) -> tuple[str, int]:
    """The (namespace, number) of an item id: ``("", 7)`` for ``t-7``, ``("acme", 7)``
    for ``t-7.acme``."""
    head, _, namespace = item.partition(".")
    return namespace, int(head.split("-", 1)[1])


class Ids:
    __slots__ = (
        "generation_floor", "item_ceiling", "item_mark", "jumped_to", "lease_ceiling",
        "lease_mark",
    )

    def __init__(self) -> None:
        # A first block is assumed; the shell makes it durable through ``reserve`` (in
        # Core.recovered) before it serves anything.
        self.lease_ceiling = BLOCK + 1
        self.item_ceiling = BLOCK + 1
        # Always ``ceiling - _MARGIN``: a counter past its mark needs the next block (one
        # comparison per request in Core.handle, no call).
        self.lease_mark = self.lease_ceiling - _MARGIN
        self.item_mark = self.item_ceiling - _MARGIN
        # A key not in the claims table starts at floor + 1: the floor is at least the
        # generation of every lease that ended (and, after a jump, of every one lost).
        self.generation_floor = 0
        # The floor the last jump (IDS_JUMPED) set: every grant of a key goes above it.
        # A key held through the jump keeps its holder's generation (the one the holder
        # was told, and reads back); only its next grant goes above this.
        self.jumped_to = 0

    def needed(self, next_lease: int, next_item: int) -> IdsReserved | None:
        """The IDS_RESERVED record of the next block if a counter is past its mark
        (one comparison each: asked at the end of every request and tick), else None."""
        if next_lease <= self.lease_mark and next_item <= self.item_mark:
            return None
        return self.next_block(next_lease, next_item)

    def next_block(self, next_lease: int, next_item: int) -> IdsReserved:
        """The IDS_RESERVED record of the next block; the caller commits it and makes it
        durable before any reply leaves (``Effects.sync``)."""
        return IdsReserved(
            Rec.IDS_RESERVED,
            max(self.lease_ceiling, next_lease + BLOCK),
            max(self.item_ceiling, next_item + BLOCK),
        )

    def apply_reserved(self, rec: tuple[Any, ...], now: float) -> None:
        self.lease_ceiling = max(self.lease_ceiling, rec[1])
        self.item_ceiling = max(self.item_ceiling, rec[2])
        self.lease_mark = self.lease_ceiling - _MARGIN
        self.item_mark = self.item_ceiling - _MARGIN
