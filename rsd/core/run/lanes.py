"""The ready line of a queue whose items have priorities or fairness keys: one FIFO lane
per (priority, fairness key), and per priority a ring of the lanes that hold items,
served in turn.

A queue starts with a plain FIFO line (queue.py) and takes a ``Lanes`` the first time an
item with a priority other than 0 or a fairness key joins it; its plain line becomes the
lane (0, None) as it is, in O(1). Plain FIFO queues never pay for any of this.

What always holds:
- ``pop`` gives the first item of the lane at the front of the highest priority's ring
  that holds any: a higher priority always goes first; within a priority, each lane
  gives one item per turn of its ring, then goes to the back, so an item waits behind at
  most one item of each other lane of its priority (one round), however many items one
  lane holds; within a lane, items go first in, first out. Items without a fairness key
  share the lane of key None;
- every operation is O(1) amortised (``remove``, the replay of a delivery that did not
  take the first ready item, is a scan of one lane, as it is of a plain line);
- an item that leaves without being delivered (it ended) leaves a stale entry in its
  lane, and the lane is compacted once such entries are half of it; a lane left with
  none queued is dropped from ``by_key`` at once and leaves its ring when it reaches
  the front, or when the rings are rebuilt once such hollow lanes are half of them: so
  memory follows the live lanes, at most twice their number plus a constant, whatever
  keys come and go;
- ``count`` is the number of queued items, never a walk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Final

from rsproto import Limits

from .items import Item

__all__ = ["Lane", "Lanes"]

_PRIORITIES: Final = Limits.MAX_PRIORITY + 1
_SPARE: Final = 32  # stale entries (or hollow lanes) tolerated before a compaction is considered


class Lane:
    """The items of one (priority, fairness key), in order; ended ones left stale."""

    __slots__ = ("hollow", "items", "key", "priority", "ringed", "stale")

    def __init__(self, priority: int, key: str | None, items: deque[Item] | None = None) -> None:
        self.priority = priority
        self.key = key
        self.items: deque[Item] = deque() if items is None else items
        self.stale = 0
        self.ringed = False  # in its priority's ring
        self.hollow = False  # dropped from ``by_key`` with nothing queued: leaves its ring


class Lanes:
    """Lanes by (priority, key), and per priority the ring of lanes served in turn."""

    __slots__ = ("busy", "by_key", "count", "hollow", "rings")

    def __init__(self, plain: deque[Item], stale: int) -> None:
        """``plain``: the queue's FIFO line so far (``stale`` of its entries ended), made
        the lane (0, None) as it is."""
        self.by_key: dict[tuple[int, str | None], Lane] = {}
        self.rings: list[deque[Lane]] = [deque() for _ in range(_PRIORITIES)]
        self.busy = 0  # bit p set while ring p may hold a lane
        self.count = len(plain) - stale
        self.hollow = 0  # hollow lanes still in a ring
        if self.count:
            lane = self.by_key[(0, None)] = Lane(0, None, plain)
            lane.stale = stale
            self._ring(lane)

    def _ring(self, lane: Lane) -> None:
        lane.ringed = True
        self.rings[lane.priority].append(lane)
        self.busy |= 1 << lane.priority

    def _lane(self, item: Item) -> Lane:
        key = (item.priority, item.fairness_key)
        lane = self.by_key.get(key)
        if lane is None:
            lane = self.by_key[key] = Lane(item.priority, item.fairness_key)
        return lane

    def push(self, item: Item) -> None:
        """``item`` at the end of its lane; the lane at the end of its ring if not in it."""
        lane = self._lane(item)
        lane.items.append(item)
        self.count += 1
        if not lane.ringed:
            self._ring(lane)

    def pop(self) -> Item | None:
        """The next item (see the module docstring), taken off its lane; None if none."""
        busy = self.busy
        while busy:
            priority = busy.bit_length() - 1
            ring = self.rings[priority]
            while ring:
                lane = ring[0]
                items = lane.items
                while items:
                    item = items.popleft()
                    if item.queued:
                        self.count -= 1
                        self.busy = busy
                        if items:
                            ring.rotate(-1)  # its turn is over: to the back
                        else:
                            self._unring(ring, lane)
                        return item
                    lane.stale -= 1
                self._unring(ring, lane)
            busy &= ~(1 << priority)
        self.busy = busy
        return None

    def _unring(self, ring: deque[Lane], lane: Lane) -> None:
        """The lane at the front of ``ring`` holds nothing queued: it leaves the ring, and
        ``by_key`` (unless a lane of its key was made since)."""
        ring.popleft()
        lane.ringed = False
        lane.stale = 0
        if lane.hollow:
            self.hollow -= 1
        elif self.by_key.get((lane.priority, lane.key)) is lane:
            del self.by_key[(lane.priority, lane.key)]

    def unpop(self, item: Item) -> None:
        """Put back the item ``pop`` just gave: first again, its lane first in its ring."""
        lane = self._lane(item)
        lane.items.appendleft(item)
        self.count += 1
        ring = self.rings[lane.priority]
        if lane.ringed:
            if ring and ring[-1] is lane:
                ring.rotate(1)  # ``pop`` had sent it to the back
        else:
            lane.ringed = True
            ring.appendleft(lane)
            self.busy |= 1 << lane.priority

    def remove(self, item: Item) -> None:
        """Take ``item`` (queued) out of its lane wherever it is. O(its lane)."""
        lane = self._lane(item)
        lane.items.remove(item)
        self.count -= 1

    def drop(self, item: Item) -> None:
        """``item`` (queued, now marked not queued) left without being delivered: its
        entry is stale; see the module docstring for what that frees."""
        self.count -= 1
        key = (item.priority, item.fairness_key)
        lane = self.by_key.get(key)
        if lane is None:
            return
        lane.stale += 1
        items = lane.items
        if lane.stale == len(items):  # nothing queued left: hollow until it leaves its ring
            items.clear()
            lane.stale = 0
            del self.by_key[key]
            if lane.ringed:
                lane.hollow = True
                self.hollow += 1
                if self.hollow > _SPARE and self.hollow * 2 > len(self.by_key) + self.hollow:
                    self._compact_rings()
        elif lane.stale > _SPARE and lane.stale * 2 > len(items):
            lane.items = deque(entry for entry in items if entry.queued)
            lane.stale = 0

    def _compact_rings(self) -> None:
        for ring in self.rings:
            if ring:
                for lane in ring:
                    if lane.hollow:
                        lane.ringed = False
                kept = [lane for lane in ring if not lane.hollow]
                ring.clear()
                ring.extend(kept)
        self.hollow = 0

    def lane_count(self) -> int:
        """Lanes with items queued (stats, tests). O(1)."""
        return len(self.by_key)

    def __iter__(self) -> Iterator[Item]:
        """The queued items, highest priority first, lane after lane in ring order, each
        lane in order: pushed again in this order they rebuild the same lanes and rings
        (snapshots)."""
        for ring in reversed(self.rings):
            for lane in ring:
                for item in lane.items:
                    if item.queued:
                        yield item
