"""Queues: one mailbox inside one scope.

A Queue holds its ready line, its parked consumers, its work_key dedupe entries and its
dead letters. Which queue a request names, the item table and the queue reads are
work.py's (``Work``).

What always holds:
- the ready line is FIFO while every item in it has priority 0 and no fairness key;
  the first item with either turns it into lanes (lanes.py: priorities, then round
  robin between fairness keys, FIFO within each lane) until the queue is freed;
- an item that leaves it without being delivered (it ended)
  leaves a stale entry behind, and the line is compacted once such entries are half of
  it, so ended items are not kept alive by a queue nobody reads;
- a queue keeps at most ``Limits.MAX_DEAD_LETTERS`` dead letters, the newest, each once;
- ``depth`` (the mailbox definition's, shared by its queues in every run) counts the
  queued items of the ready line and the running deliveries, changed only here and in
  ``start_running``/``stop_running``: so the server reads depths in O(1), with no walk;
- ``debounced`` maps each debounce key to the message that holds it: DELAYED or
  PENDING, never delivered (debounce.py); an entry leaves it when its message is
  delivered or ends (``let_go``), so it never holds more than the queue's live items;
- a queue is ``held`` while it is paused in its run (``paused``) or its mailbox is
  paused for every run (``depth.paused``): it takes items but hands none out
  (work/pauses.py); a queue paused in its run is kept (never freed) until resumed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from rsproto import Limits

from ..ground.waits import WaitLine
from ..tenant.mailbox import Depth
from .items import Item
from .lanes import Lanes

__all__ = ["Queue"]


class Queue:
    """One mailbox inside one scope."""

    __slots__ = (
        "blocked", "blocked_by_parents", "consumers", "dead_ids", "dead_letters", "debounced",
        "dedupe", "delayed", "depth", "lanes", "mailbox", "paused", "ready", "running", "scope",
        "stale", "tenant", "waiting",
    )

    def __init__(
        self, tenant: str, scope: str, mailbox: str, depth: Depth | None = None
    ) -> None:
        self.tenant = tenant
        self.scope = scope
        self.mailbox = mailbox
        self.ready: deque[Item] = deque()  # may hold items no longer queued: skipped
        self.stale = 0  # how many entries of ``ready`` are such leftovers
        self.lanes: Lanes | None = None  # the ready line, once an item has an order
        self.consumers = WaitLine()  # parked receives (ReceiveWait)
        self.dedupe: dict[str, tuple[str, bytes, float]] = {}  # work_key -> id, digest, until
        self.debounced: dict[str, Item] = {}  # debounce key -> its undelivered message
        self.dead_letters: deque[dict[str, Any]] = deque()
        # the ids in ``dead_letters`` -> the stored bytes of each one's data (tenants.py)
        self.dead_ids: dict[str, int] = {}
        self.running = 0
        self.delayed = 0  # DELAYED items of this queue (workbook.py: ``Work.set_state``)
        self.waiting = 0  # WAITING tasks of this queue (likewise): they keep it
        self.blocked = 0  # pending items waiting in a pool's or quota's line (blocked.py)
        self.blocked_by_parents = 0  # BLOCKED tasks of this queue (work/parents.py)
        self.depth = depth if depth is not None else Depth()  # its mailbox's, shared
        self.paused = False  # paused in this run alone (work/pauses.py)

    @property
    def held(self) -> bool:
        """Whether it hands nothing out: paused here or for every run. O(1)."""
        return self.paused or self.depth.paused

    def push(self, item: Item) -> None:
        """Put a pending ``item`` at the end of the ready line (of its lane)."""
        item.queued = True
        lanes = self.lanes
        if lanes is None:
            if not item.priority and item.fairness_key is None:
                self.ready.append(item)
                self.depth.ready += 1
                return
            lanes = self._to_lanes()
        lanes.push(item)
        self.depth.ready += 1

    def extend(self, items: list[Item], plain: bool) -> None:
        """Put ``items`` (pending, marked queued) at the end of the ready line, in order
        (recovery's fast path); ``plain``: none has a priority or fairness key."""
        if plain and self.lanes is None:
            self.ready.extend(items)
            self.depth.ready += len(items)
            return
        for item in items:
            self.push(item)

    def _to_lanes(self) -> Lanes:
        """The plain line becomes the lane (0, None) of new lanes. O(1)."""
        lanes = self.lanes = Lanes(self.ready, self.stale)
        self.ready = deque()
        self.stale = 0
        return lanes

    def ready_count(self) -> int:
        """Items in the ready line. O(1)."""
        count = len(self.ready) - self.stale
        return count if self.lanes is None else count + self.lanes.count

    def counts(self) -> dict[str, int]:
        """What QUEUE_INSPECT and ADMIN_QUEUES show of it. O(1)."""
        return {
            "ready": self.ready_count(),
            "running": self.running,
            "delayed": self.delayed,
            "waiting": self.waiting,
            "consumers": len(self.consumers),
            "dead_letters": len(self.dead_letters),
            "paused": self.held,
            "blocked_by_parents": self.blocked_by_parents,
        }

    def queued(self) -> Iterator[Item]:
        """The items of the ready line, in an order that pushed again rebuilds it."""
        for item in self.ready:
            if item.queued:
                yield item
        if self.lanes is not None:
            yield from self.lanes

    def start_running(self) -> None:
        self.running += 1
        self.depth.running += 1

    def stop_running(self) -> None:
        self.running -= 1
        self.depth.running -= 1

    def holds_nothing(self) -> bool:
        return (
            len(self.ready) == self.stale
            and (self.lanes is None or self.lanes.count == 0)
            and not self.consumers
            and self.running == 0
            and self.blocked == 0
            and self.delayed == 0
            and self.waiting == 0
            and self.blocked_by_parents == 0
            and not self.dedupe
            and not self.dead_letters
            and not self.paused
        )

    def pop_ready(self) -> Item | None:
        """The first item of the ready line, taken off it; None if none is ready."""
        if self.lanes is not None:
            item: Item | None = self.lanes.pop()
            if item is not None:
                item.queued = False
                self.depth.ready -= 1
            return item
        ready = self.ready
        while ready:
            item = ready.popleft()
            if item.queued:
                item.queued = False
                self.depth.ready -= 1
                return item
            self.stale -= 1
        return None

    def unpop(self, item: Item) -> None:
        """Put back the item ``pop_ready`` just gave, at the head of the line."""
        item.queued = True
        if self.lanes is not None:
            self.lanes.unpop(item)
        else:
            self.ready.appendleft(item)
        self.depth.ready += 1

    def take(self, item: Item) -> None:
        """Take a queued ``item`` off the line (the replay of its delivery). A delivery
        takes the first ready item, so this is O(1) amortised; anything else is a scan."""
        head = self.pop_ready()
        if head is item:
            return
        if head is not None:
            self.unpop(head)
        if self.lanes is not None:
            self.lanes.remove(item)
        else:
            self.ready.remove(item)
        item.queued = False
        self.depth.ready -= 1

    def drop(self, item: Item) -> None:
        """An item left the ready line without being handed out (it ended): leave its
        entry behind, and compact the line once leftovers are half of it, so that ended
        items (and their payloads) are not kept alive by a queue nobody reads."""
        if not item.queued:
            return
        item.queued = False
        self.depth.ready -= 1
        if self.lanes is not None:
            self.lanes.drop(item)
            return
        self.stale += 1
        if self.stale == len(self.ready):
            self.ready.clear()
            self.stale = 0
        elif self.stale > 32 and self.stale * 2 > len(self.ready):
            self.ready = deque(entry for entry in self.ready if entry.queued)
            self.stale = 0

    def let_go(self, item: Item) -> None:
        """``item`` (which holds a debounce key) was delivered or ended: the key is free,
        the next send with it starts a new message. O(1)."""
        key = item.debounce_key
        item.debounce_key = None
        if key is not None and self.debounced.get(key) is item:
            del self.debounced[key]

    def add_dead_letter(self, entry: dict[str, Any], size: int) -> int:
        """Keep the newest MAX_DEAD_LETTERS; an entry already present is not added twice.
        ``size``: the stored bytes of its data. Returns the change in the stored bytes
        the queue's dead letters hold (the caller charges its tenant)."""
        if entry["id"] in self.dead_ids:
            return 0
        self.dead_letters.append(entry)
        self.dead_ids[entry["id"]] = size
        while len(self.dead_letters) > Limits.MAX_DEAD_LETTERS:
            size -= self.dead_ids.pop(self.dead_letters.popleft()["id"], 0)
        return size

    def drop_dead_letter(self, dead_id: str) -> int:
        """Take dead letter ``dead_id`` off the list (requeued or deleted: deadletters.py),
        looking at no more than MAX_DEAD_LETTERS entries. Returns the stored bytes its
        data held (the caller gives them back to its tenant); 0 if it is not there."""
        size = self.dead_ids.pop(dead_id, None)
        if size is None:
            return 0
        for entry in self.dead_letters:
            if entry["id"] == dead_id:
                self.dead_letters.remove(entry)
                break
        return size
