"""A hashed timer wheel: deadlines rounded up to ticks, one bucket per occupied tick.

Ensures:
- an item scheduled for deadline ``d`` is returned by ``pop_due(now)`` only once
  ``now >= d`` (exactly: a slot's time is never below any deadline in it, float
  rounding included), and at the latest one tick after;
- ``schedule`` is O(1) amortised (a heap push only when a tick gets its first item);
  ``cancel(deadline, item)`` is O(1) amortised: the slot is computed again from the
  deadline the item was scheduled for, and the bucket is a dict keyed by item, so an
  ended wait or lease leaves the wheel at once instead of at its deadline;
- popping is O(items due), or O(limit) when given one: a mass of deadlines at one
  instant can be fired a slice at a time (``Core.tick``); ``len`` is a counter, never a
  walk;
- the heap of slots holds at most twice the occupied slots, plus a constant: a slot
  whose bucket was emptied by cancels stays in the heap until it reaches the top or the
  heap is rebuilt, which happens once such leftovers are the majority.
Renewing a lease costs no wheel work (leases are re-armed lazily when they come due).
``next_deadline()`` is what the server sleeps until: nothing polls.

Rows, for items that know their own deadline (leases; one entry costs a list slot, 8
bytes, where a bucket entry costs ~30): ``schedule_row(deadline, item)`` appends to the
slot's row, and ``cancel_row(deadline)`` only counts one entry of that row as stale (the
owner knows it ended); the owner's ``fresh(item, slot)`` says whether an entry is still
wanted. A row is rebuilt without its stale entries once they are half of it (paid for by
the cancels that made them), and dropped once all are stale, so a row holds at most
twice its wanted entries, plus a constant. Popping hands back only fresh entries, each
once (the owner's ``taken(item)`` is told at once, so an entry handed back is never
cancelled as if still there), after the slot's bucket items. ``len`` counts bucket
entries plus rows' wanted ones. The rows' owner (``RowOwner``: the lease table) is
given at construction; a wheel without one keeps every row entry.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any, Final, Protocol

__all__ = ["RowOwner", "Timer", "TimerWheel"]

_SPARE_SLOTS: Final = 64  # leftover heap entries tolerated before a rebuild is considered
_SPARE_STALE: Final = 16  # stale row entries tolerated before a row is rebuilt


class RowOwner(Protocol):
    """What the wheel asks of the owner of the items in its rows."""

    def fresh(self, item: Any, slot: int) -> bool:
        """Whether a row entry of ``item`` at ``slot`` is still wanted."""

    def taken(self, item: Any) -> None:
        """``item``'s entry was handed back by ``pop_due``: it has none until re-armed."""


class _KeepAll:
    """The rows' owner of a wheel given none: every entry is wanted."""

    def fresh(self, item: Any, slot: int) -> bool:
        return True

    def taken(self, item: Any) -> None:
        pass


class TimerWheel:
    __slots__ = (
        "_buckets", "_count", "_heap", "_rows", "_stale", "_starts", "fresh", "taken", "tick",
    )

    def __init__(self, tick: float = 0.005, rows: RowOwner | None = None) -> None:
        self.tick = tick
        # slot -> {item: how many times it is scheduled there}; insertion ordered, so
        # a tick's items come back in schedule order.
        self._buckets: dict[int, dict[Any, int]] = {}
        # slot -> row items in schedule order, stale ones included; of a row, how many
        # are stale (if any) and how many were already taken (if any: a partial pop).
        self._rows: dict[int, list[Any]] = {}
        self._stale: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._heap: list[int] = []  # occupied slots, and some emptied by cancels
        self._count = 0
        owner = rows if rows is not None else _KeepAll()
        self.fresh = owner.fresh  # the rows' owner's (bound once: the pop loop calls them)
        self.taken = owner.taken

    def __len__(self) -> int:
        return self._count

    def slot_of(self, deadline: float) -> int:
        """The slot an entry for ``deadline`` goes to."""
        return self._slot(deadline)

    def _slot(self, deadline: float) -> int:
        tick = self.tick
        slot = math.ceil(deadline / tick)
        while slot * tick < deadline:  # division rounded down: never fire early
            slot += 1
        return slot

    def schedule(self, deadline: float, item: Any) -> None:
        slot = self._slot(deadline)
        bucket = self._buckets.get(slot)
        if bucket is None:
            self._buckets[slot] = {item: 1}
            if slot not in self._rows:
                self._occupy(slot)
        else:
            bucket[item] = bucket.get(item, 0) + 1
        self._count += 1

    def _occupy(self, slot: int) -> None:
        """A slot got its first entry: on the heap."""
        heap = self._heap
        heapq.heappush(heap, slot)
        if len(heap) > 2 * (len(self._buckets) + len(self._rows)) + _SPARE_SLOTS:
            self._compact()

    def _vacated(self) -> None:
        """A slot lost its last entry: its heap entry stays until it surfaces, or until
        such leftovers are the majority."""
        if len(self._heap) > 2 * (len(self._buckets) + len(self._rows)) + _SPARE_SLOTS:
            self._compact()

    def schedule_row(self, deadline: float, item: Any) -> None:
        """One entry of ``item`` in the row of ``deadline``'s slot."""
        slot = self._slot(deadline)
        row = self._rows.get(slot)
        if row is None:
            self._rows[slot] = [item]
            if slot not in self._buckets:
                self._occupy(slot)
        else:
            row.append(item)
        self._count += 1

    def cancel_row(self, deadline: float) -> None:
        """One entry in the row of ``deadline``'s slot is stale now (its owner knows it
        is there, not yet handed back). O(1) amortised."""
        slot = self._slot(deadline)
        row = self._rows.get(slot)
        if row is None:
            return
        self._count -= 1
        stale = self._stale.get(slot, 0) + 1
        waiting = len(row) - self._starts.get(slot, 0)
        if stale >= waiting:
            self._drop_row(slot)
        elif 2 * stale > waiting + _SPARE_STALE:
            self._rebuild_row(slot)
        else:
            self._stale[slot] = stale

    def _drop_row(self, slot: int) -> None:
        del self._rows[slot]
        self._stale.pop(slot, None)
        self._starts.pop(slot, None)
        if slot not in self._buckets:
            self._vacated()

    def _rebuild_row(self, slot: int) -> None:
        """Keep a row's fresh entries, each object once, in order: O(the row)."""
        fresh = self.fresh
        seen: set[int] = set()
        kept = []
        row = self._rows[slot]
        for item in itertools.islice(row, self._starts.pop(slot, 0), None):
            if id(item) not in seen and fresh(item, slot):
                seen.add(id(item))
                kept.append(item)
        self._stale.pop(slot, None)
        if kept:
            self._rows[slot] = kept
        else:
            self._drop_row(slot)

    def cancel(self, deadline: float, item: Any) -> bool:
        """Take one entry of ``item`` scheduled for ``deadline`` off the wheel; False if
        there is none (it already came due, or was never scheduled there)."""
        slot = self._slot(deadline)
        bucket = self._buckets.get(slot)
        if bucket is None:
            return False
        times = bucket.get(item)
        if times is None:
            return False
        if times == 1:
            del bucket[item]
            if not bucket:
                del self._buckets[slot]  # its heap entry is skipped when it surfaces
                if slot not in self._rows:
                    self._vacated()
        else:
            bucket[item] = times - 1
        self._count -= 1
        return True

    def _compact(self) -> None:
        """Rebuild the heap from the occupied slots (leftovers are the majority):
        O(occupied slots), paid for by the cancels that made the leftovers."""
        heap = self._heap
        heap[:] = self._buckets.keys() | self._rows.keys()
        heapq.heapify(heap)

    def next_deadline(self) -> float | None:
        heap, buckets, rows = self._heap, self._buckets, self._rows
        while heap and heap[0] not in buckets and heap[0] not in rows:
            heapq.heappop(heap)  # a slot emptied by cancels
        return heap[0] * self.tick if heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[Any]:
        """Take entries due by ``now``, earliest slot first and in schedule order within
        a slot (its bucket's, then its row's fresh ones): all of them, or the first
        ``limit``. What is left stays on the wheel, in its place (a slot partly taken
        keeps the rest of its entries, in order), so the next call goes on exactly where
        this one stopped. With a ``limit``, the stale row entries skipped count too: the
        work is O(limit) whatever ended, and fewer (even none) may come back while more
        are due (``next_deadline()`` then says so)."""
        heap = self._heap
        if not heap:
            return []
        tick = self.tick
        if heap[0] * tick > now:
            return []
        due: list[Any] = []
        buckets, rows = self._buckets, self._rows
        while heap and heap[0] * tick <= now:
            if limit is not None and len(due) >= limit:
                break
            slot = heap[0]
            bucket = buckets.get(slot)
            if bucket is not None:
                if limit is not None and len(due) + len(bucket) > limit:
                    self._take_first(bucket, limit - len(due), due)
                    break
                del buckets[slot]
                for item, times in bucket.items():
                    if times == 1:
                        due.append(item)
                    else:
                        due.extend([item] * times)
            if slot in rows:
                if limit is not None and len(due) >= limit:
                    break
                self._take_row(slot, -1 if limit is None else limit - len(due), due)
                if slot in rows:
                    break  # partly taken: the rest waits for the next call
            heapq.heappop(heap)
        self._count -= len(due)
        return due

    def _take_row(self, slot: int, room: int, due: list[Any]) -> None:
        """Move a due row's fresh entries to ``due``, at most ``room`` (-1: all), looking
        at no more than ``2 * room + _SPARE_STALE`` entries (stale ones are skipped, and
        count). A row not wholly taken keeps its place and the rest of its entries."""
        row = self._rows[slot]
        fresh, taken = self.fresh, self.taken
        start = self._starts.pop(slot, 0)
        stale = self._stale.pop(slot, 0)
        end = len(row)
        looks = 2 * room + _SPARE_STALE if room >= 0 else end
        while start < end:
            if room == 0 or looks == 0:
                self._starts[slot] = start
                if stale > 0:
                    self._stale[slot] = stale
                return
            item = row[start]
            start += 1
            looks -= 1
            if fresh(item, slot):
                taken(item)
                due.append(item)
                room -= 1
            else:
                stale -= 1
        del self._rows[slot]

    @staticmethod
    def _take_first(bucket: dict[Any, int], room: int, due: list[Any]) -> None:
        """Move the first entries of a bucket that has more than ``room`` items to
        ``due``, up to ``room`` of them (an item scheduled twice counts twice); the
        bucket keeps the rest, still in order, and is never left empty."""
        for item in list(itertools.islice(bucket, room)):
            if room == 0:
                break
            times = bucket[item]
            taken = min(times, room)
            due.extend([item] * taken)
            room -= taken
            if taken == times:
                del bucket[item]
            else:
                bucket[item] = times - taken


class Timer:
    """A wheel item that calls ``fn(now, arg)`` when due: for one-off deadlines.

    Two timers with the same ``fn`` and ``arg`` are equal, so the owner of a deadline
    can cancel it by naming it again, without keeping the Timer object."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Any, arg: Any) -> None:
        self.fn = fn
        self.arg = arg

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Timer and self.fn == other.fn and self.arg == other.arg
        )

    def __hash__(self) -> int:
        return hash((self.fn, self.arg))

    def fire(self, now: float) -> None:
        self.fn(now, self.arg)
