"""Paged listings: resume a walk over a changing collection in work proportional to a page.

A ``PagedIndex`` keeps the objects of one collection (one tenant's runs, one run's claims
or items, one tenant's pools) in the order they were added, each under a sequence number
of its own that only grows, in blocks of at most ``BLOCK`` entries. A listing returns a
page and a cursor (the sequence number of the last entry it looked at); the next request
goes on right after it by bisecting the blocks' first numbers and then the block, so
resuming costs O(log n), never a walk from the start.

What always holds:
- ``add`` appends in O(1); removal is lazy: the collection's owner says ``removed()`` and
  the entry stays until a compaction asks ``alive(obj)``. Each removal pays for
  ``_STEP`` entries of compaction, spent one whole block at a time, in rotation over the
  blocks: no call ever does more than one block's work (no pause grows with the
  collection), the work is O(1) amortised per removal, and the dead entries stay a
  bounded fraction of the index (a full rotation costs a quarter as many removals as the
  index has entries), so the index holds O(live objects);
- neighbouring blocks that fit in one after a compaction are merged, and empty ones
  dropped, so the blocks stay few and mostly full;
- ``page`` looks at no more than ``scan`` entries (live, dead or filtered out), so one
  request's work is bounded by its own limit whatever the collection holds; a page may
  then come back short, or empty, with a cursor to go on from (as Redis's SCAN);
- with a ``weight`` (the bytes an object adds to the reply), a page also stops before
  the object that would take it past ``budget``, but never before its first one: the
  cursor then says to go on from that object, so a listing of large objects fits its
  frames page by page;
- every live object present for the whole walk is returned exactly once across the
  pages; an object added during the walk may or may not be; one removed is not;
- a walk may go the other way, newest first (``page`` with ``newest_first``): the same
  bounds, the cursor then the sequence number to go on below. So "the newest ten" costs
  at most its ``scan``, never a sort of the collection.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Final, Generic, TypeVar

__all__ = ["BLOCK", "PagedIndex"]

T = TypeVar("T")

BLOCK: Final = 512  # entries per block: the most one compaction step looks at
_STEP: Final = 4  # entries of compaction paid for by each removal
_MIN_WORK: Final = 64  # the least work a compaction step waits for (so at most 16 dead wait)


class _Block(Generic[T]):
    __slots__ = ("objs", "seqs")

    def __init__(self) -> None:
        self.seqs = array("q")  # ascending sequence numbers, parallel to ``objs``
        self.objs: list[T] = []


class PagedIndex(Generic[T]):
    __slots__ = ("alive", "blocks", "credit", "firsts", "next_seq", "sweep", "tail_objs",
                 "tail_seqs")

    def __init__(self, alive: Callable[[T], bool]) -> None:
        self.alive = alive  # whether an entry's object is still in its collection
        self.blocks: list[_Block[T]] = [_Block()]
        self.firsts: list[int] = [1]  # each block's first sequence number
        self.next_seq = 1
        self.credit = 0  # compaction work paid for by removals and not yet spent
        self.sweep = 0  # the block the next compaction step takes
        self.tail_objs = self.blocks[-1].objs  # the last block's lists: where ``add`` goes
        self.tail_seqs = self.blocks[-1].seqs

    def __len__(self) -> int:
        """Entries held, dead ones included (for tests and stats)."""
        return sum(len(block.objs) for block in self.blocks)

    def live(self) -> list[T]:
        """Every live object, in the order they were added: O(entries), dead ones
        included (a bounded fraction of them, see the module docstring)."""
        alive = self.alive
        return [obj for block in self.blocks for obj in block.objs if alive(obj)]

    def add(self, obj: T) -> None:
        objs = self.tail_objs
        if len(objs) >= BLOCK:
            block: _Block[T] = _Block()
            self.blocks.append(block)
            self.firsts.append(self.next_seq)
            objs = self.tail_objs = block.objs
            self.tail_seqs = block.seqs
        self.tail_seqs.append(self.next_seq)
        objs.append(obj)
        self.next_seq += 1

    def extend(self, objs: list[T]) -> None:
        """``add`` each of ``objs``, in order (recovery adds a frame's items at once)."""
        start = 0
        while start < len(objs):
            tail = self.tail_objs
            if len(tail) >= BLOCK:
                self.add(objs[start])  # opens the next block
                start += 1
                continue
            part = objs[start : start + BLOCK - len(tail)]
            seq = self.next_seq
            tail.extend(part)
            self.tail_seqs.extend(range(seq, seq + len(part)))
            self.next_seq = seq + len(part)
            start += len(part)

    def removed(self) -> None:
        """One object of the collection left it: pay for some compaction, and compact
        the next block in rotation once that pays for it."""
        credit = self.credit = self.credit + _STEP
        if credit >= _MIN_WORK:
            if self.sweep >= len(self.blocks):
                self.sweep = 0
            if credit >= len(self.blocks[self.sweep].objs):
                self._compact(self.sweep)

    def _compact(self, index: int) -> None:
        """Drop the dead entries of block ``index``; drop it if empty, merge it with the
        next one if both fit in one block; the sweep moves on."""
        blocks = self.blocks
        block = blocks[index]
        self.credit = max(0, self.credit - max(_MIN_WORK, len(block.objs)))
        alive = self.alive
        keep = [i for i, obj in enumerate(block.objs) if alive(obj)]
        if len(keep) != len(block.objs):
            seqs = block.seqs
            block.seqs = array("q", [seqs[i] for i in keep])
            block.objs = [block.objs[i] for i in keep]
        self.sweep = index + 1
        if not block.objs and index < len(blocks) - 1:
            del blocks[index], self.firsts[index]
            self.sweep = index
        else:
            following = index + 1
            if following < len(blocks) and (
                len(block.objs) + len(blocks[following].objs) <= BLOCK
            ):
                nxt = blocks[following]
                block.seqs.extend(nxt.seqs)
                block.objs.extend(nxt.objs)
                del blocks[following], self.firsts[following]
            if block.seqs:
                self.firsts[index] = block.seqs[0]
        self.tail_objs = blocks[-1].objs
        self.tail_seqs = blocks[-1].seqs

    def page(
        self, cursor: int, limit: int, scan: int, match: Callable[[T], bool] | None = None,
        newest_first: bool = False, weight: Callable[[T], int] | None = None,
        budget: int = 0,
    ) -> tuple[list[T], int | None]:
        """Up to ``limit`` live objects added after ``cursor`` (0: from the start) that
        ``match``, looking at no more than ``scan`` entries (and, with ``weight``,
        weighing no more than ``budget`` together, the first one whatever it weighs);
        and the cursor to go on from, or None when the walk is complete.
        ``newest_first``: the walk goes from the newest down, ``cursor`` 0 from the
        newest, else from below it."""
        if newest_first:
            return self._page_down(cursor, limit, scan, match, weight, budget)
        blocks, alive = self.blocks, self.alive
        b = max(0, bisect_right(self.firsts, cursor) - 1) if cursor > 0 else 0
        pos = bisect_right(blocks[b].seqs, cursor) if cursor > 0 else 0
        out: list[T] = []
        looked = 0
        last = cursor
        while b < len(blocks):
            block = blocks[b]
            objs, seqs = block.objs, block.seqs
            while pos < len(objs):
                if looked == scan or len(out) == limit:
                    return out, last
                obj = objs[pos]
                if alive(obj) and (match is None or match(obj)):
                    if weight is not None:
                        budget -= weight(obj)
                        if budget < 0 and out:
                            return out, last  # the next page starts with it
                    out.append(obj)
                last = seqs[pos]
                looked += 1
                pos += 1
            b += 1
            pos = 0
        return out, None

    def _page_down(
        self, cursor: int, limit: int, scan: int, match: Callable[[T], bool] | None,
        weight: Callable[[T], int] | None, budget: int,
    ) -> tuple[list[T], int | None]:
        """``page`` newest first: the entries added before ``cursor`` (0: every one)."""
        blocks, alive = self.blocks, self.alive
        if cursor > 0:
            b = bisect_right(self.firsts, cursor - 1) - 1  # the block of the seqs below it
            if b < 0:
                return [], None
            pos = bisect_left(blocks[b].seqs, cursor) - 1
        else:
            b = len(blocks) - 1
            pos = len(blocks[b].objs) - 1
        out: list[T] = []
        looked = 0
        last = cursor
        while b >= 0:
            block = blocks[b]
            objs, seqs = block.objs, block.seqs
            while pos >= 0:
                if looked == scan or len(out) == limit:
                    return out, last
                obj = objs[pos]
                if alive(obj) and (match is None or match(obj)):
                    if weight is not None:
                        budget -= weight(obj)
                        if budget < 0 and out:
                            return out, last  # the next page starts with it
                    out.append(obj)
                last = seqs[pos]
                looked += 1
                pos -= 1
            b -= 1
            if b >= 0:
                pos = len(blocks[b].objs) - 1
        return out, None
