"""Identifiers that must never repeat: fencing tokens, item ids and generations.

Lease ids (the fencing tokens) and item ids come from counters that only grow. A
counter may hand out ids only below a ceiling that is already on disk: when it comes
near its ceiling, the core reserves the next block with an IDS_RESERVED record and
marks the batch as needing an fsync before its replies leave, whatever the fsync
policy. So after any crash, under any policy, every id a client may have seen is below
a durable ceiling, and recovery restarts the counters there.

A key's generation grows strictly with each new owner (a grant gives its generation
plus one) and never repeats, but need not grow by one: a key nobody holds is forgotten
(claims.py), and ``generation_floor``, the highest generation of any lease that ended,
is where a key not in the table starts again. A crash under ``everysec`` or ``no`` can
lose the records of recent grants: each took a lease id, so at most ``lease_ceiling -
next_lease`` of them (``delta``), each at most one above the highest generation before
it. After an unclean stop every key, held or not, therefore moves to the highest
generation known plus ``delta`` (IDS_JUMPED). Generations may jump; never go back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .records import Rec

if TYPE_CHECKING:
    from .tables import Tables

__all__ = ["BLOCK", "Ids"]

BLOCK = 4096  # ids reserved per IDS_RESERVED record
_MARGIN = 256  # reserve again when fewer than this many ids are left


class Ids:
    __slots__ = ("generation_floor", "item_ceiling", "item_mark", "lease_ceiling", "lease_mark")

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

    def reserve_if_needed(
        self, next_lease: int, next_item: int, tables: Tables, now: float
    ) -> None:
        if next_lease <= self.lease_mark and next_item <= self.item_mark:
            return
        self.reserve(next_lease, next_item, tables, now)

    def reserve(self, next_lease: int, next_item: int, tables: Tables, now: float) -> None:
        """Reserve the next block (an IDS_RESERVED record), durable before any reply."""
        tables.effects.sync = True
        tables.commit(
            (
                Rec.IDS_RESERVED,
                max(self.lease_ceiling, next_lease + BLOCK),
                max(self.item_ceiling, next_item + BLOCK),
            ),
            now,
        )

    def apply_reserved(self, rec: tuple[Any, ...], now: float) -> None:
        self.lease_ceiling = max(self.lease_ceiling, rec[1])
        self.item_ceiling = max(self.item_ceiling, rec[2])
        self.lease_mark = self.lease_ceiling - _MARGIN
        self.item_mark = self.item_ceiling - _MARGIN
