"""A hashed timer wheel: deadlines rounded up to ticks, one bucket per occupied tick.

Ensures: an item scheduled for deadline ``d`` is returned by ``pop_due(now)`` only once
``now >= d`` (exactly: a slot's time is never below any deadline in it, float rounding
included), and at the latest one tick after. Scheduling is O(1) amortised (a heap push
only when a tick gets its first item); popping is O(items due). There is no cancel:
owners keep their own notion of whether a timer still matters and ignore stale items,
so a lease renewal costs no wheel work at all. ``next_deadline()`` is what the server
sleeps until: nothing polls.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

__all__ = ["Timer", "TimerWheel"]


class TimerWheel:
    __slots__ = ("_buckets", "_heap", "tick")

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self._buckets: dict[int, list[Any]] = {}
        self._heap: list[int] = []

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def schedule(self, deadline: float, item: Any) -> None:
        tick = self.tick
        slot = math.ceil(deadline / tick)
        while slot * tick < deadline:  # division rounded down: never fire early
            slot += 1
        bucket = self._buckets.get(slot)
        if bucket is None:
            self._buckets[slot] = [item]
            heapq.heappush(self._heap, slot)
        else:
            bucket.append(item)

    def next_deadline(self) -> float | None:
        return self._heap[0] * self.tick if self._heap else None

    def pop_due(self, now: float) -> list[Any]:
        heap = self._heap
        if not heap:
            return []
        tick = self.tick
        if heap[0] * tick > now:
            return []
        due: list[Any] = []
        buckets = self._buckets
        while heap and heap[0] * tick <= now:
            due.extend(buckets.pop(heapq.heappop(heap)))
        return due


class Timer:
    """A wheel item that calls ``fn(now, arg)`` when due: for one-off deadlines."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Any, arg: Any) -> None:
        self.fn = fn
        self.arg = arg

    def fire(self, now: float) -> None:
        self.fn(now, self.arg)
