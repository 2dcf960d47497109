"""Paged listings: resume a walk over a changing collection in work proportional to a page.

A ``PagedIndex`` keeps the objects of one collection (one tenant's runs, one run's claims
or items, one tenant's pools) in the order they were added, each under a sequence number
of its own that only grows. A listing returns a page and a cursor (the sequence number of
the last object it looked at); the next request goes on right after it by bisecting the
sequence numbers, so resuming costs O(log n), never a walk from the start.

What always holds:
- ``add`` appends in O(1); removal is lazy: the owner says ``removed()`` and the entry
  stays until ``alive(obj)`` says otherwise at a read; once the dead entries are more
  than half of the index (and more than a few) they are dropped in one pass, so the
  index holds at most about twice the live objects and the pass is O(1) amortised per
  removal;
- ``page`` looks at no more than ``scan`` entries (live, dead or filtered out), so one
  request's work is bounded by its own limit whatever the collection holds; a page may
  then come back short, or empty, with a cursor to go on from (as Redis's SCAN);
- every live object present for the whole walk is returned exactly once across the
  pages; an object added during the walk may or may not be; one removed is not.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PagedIndex"]

T = TypeVar("T")

_COMPACT_AFTER = 32  # dead entries tolerated before compaction is considered


class PagedIndex(Generic[T]):
    __slots__ = ("alive", "dead", "next_seq", "objs", "seqs")

    def __init__(self, alive: Callable[[T], bool]) -> None:
        self.alive = alive  # whether an entry's object is still in its collection
        self.seqs = array("q")  # ascending sequence numbers, parallel to ``objs``
        self.objs: list[T] = []
        self.next_seq = 1
        self.dead = 0  # entries whose object left the collection (counted by ``removed``)

    def __len__(self) -> int:
        return len(self.objs) - self.dead

    def add(self, obj: T) -> None:
        self.seqs.append(self.next_seq)
        self.next_seq += 1
        self.objs.append(obj)

    def removed(self) -> None:
        """One object of the collection left it: drop the dead entries once they are
        more than half of the index (amortised O(1) per removal)."""
        self.dead += 1
        if self.dead > _COMPACT_AFTER and self.dead * 2 > len(self.objs):
            alive = self.alive
            keep = [i for i, obj in enumerate(self.objs) if alive(obj)]
            self.seqs = array("q", (self.seqs[i] for i in keep))
            self.objs = [self.objs[i] for i in keep]
            self.dead = 0

    def page(
        self, cursor: int, limit: int, scan: int, match: Callable[[T], bool] | None = None
    ) -> tuple[list[T], int | None]:
        """Up to ``limit`` live objects added after ``cursor`` (0: from the start) that
        ``match``, looking at no more than ``scan`` entries; and the cursor to go on
        from, or None when the walk is complete."""
        start = bisect_right(self.seqs, cursor) if cursor > 0 else 0
        objs, alive = self.objs, self.alive
        end = min(len(objs), start + scan)
        out: list[T] = []
        index = start
        while index < end and len(out) < limit:
            obj = objs[index]
            if alive(obj) and (match is None or match(obj)):
                out.append(obj)
            index += 1
        if index >= len(objs):
            return out, None
        return out, self.seqs[index - 1] if index > start else cursor
