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
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

__all__ = ["Timer", "TimerWheel"]

_SPARE_SLOTS = 64  # leftover heap entries tolerated before a rebuild is considered


class TimerWheel:
    __slots__ = ("_buckets", "_count", "_heap", "tick")

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        # slot -> {item: how many times it is scheduled there}; insertion ordered, so
        # a tick's items come back in schedule order.
        self._buckets: dict[int, dict[Any, int]] = {}
        self._heap: list[int] = []  # occupied slots, and some emptied by cancels
        self._count = 0

    def __len__(self) -> int:
        return self._count

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
            buckets = self._buckets
            buckets[slot] = {item: 1}
            heap = self._heap
            heapq.heappush(heap, slot)
            if len(heap) > 2 * len(buckets) + _SPARE_SLOTS:
                self._compact()
        else:
            bucket[item] = bucket.get(item, 0) + 1
        self._count += 1

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
                buckets = self._buckets
                del buckets[slot]  # its heap entry is skipped when it surfaces
                if len(self._heap) > 2 * len(buckets) + _SPARE_SLOTS:
                    self._compact()
        else:
            bucket[item] = times - 1
        self._count -= 1
        return True

    def _compact(self) -> None:
        """Rebuild the heap from the occupied slots (leftovers are the majority):
        O(occupied slots), paid for by the cancels that made the leftovers."""
        heap = self._heap
        heap[:] = self._buckets
        heapq.heapify(heap)

    def next_deadline(self) -> float | None:
        heap, buckets = self._heap, self._buckets
        while heap and heap[0] not in buckets:
            heapq.heappop(heap)  # a slot emptied by cancels
        return heap[0] * self.tick if heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[Any]:
        """Take entries due by ``now``, earliest slot first and in schedule order within
        a slot: all of them, or the first ``limit``. What is left stays on the wheel, in
        its place (a slot partly taken keeps the rest of its entries, in order), so the
        next call goes on exactly where this one stopped."""
        heap = self._heap
        if not heap:
            return []
        tick = self.tick
        if heap[0] * tick > now:
            return []
        due: list[Any] = []
        buckets = self._buckets
        while heap and heap[0] * tick <= now:
            if limit is not None and len(due) >= limit:
                break
            slot = heap[0]
            bucket = buckets.get(slot)
            if bucket is None:
                heapq.heappop(heap)  # emptied by cancels
                continue
            if limit is not None and len(due) + len(bucket) > limit:
                self._take_first(bucket, limit - len(due), due)
                break
            heapq.heappop(heap)
            del buckets[slot]
            for item, times in bucket.items():
                if times == 1:
                    due.append(item)
                else:
                    due.extend([item] * times)
        self._count -= len(due)
        return due

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
