"""A task group: its members' counters, kept exact as they move, and its waiters by need.

The object the group rules (groupbook.py) keep, held by its run (``Scope.groups``).
``succeeded`` (in the order they succeeded) and ``live`` (unfinished) are dicts, so a
success costs O(1) and ``reach`` (how many can still succeed) is O(1); ``moved`` is the
one bookkeeping of a member's move (tally.py calls it, live and in replay). A group
leaves its run (and its index, ``Scope.group_pages``) with its last known member, once
nobody waits on it.
"""

from __future__ import annotations

from typing import Any

from ..ground.waits import WaitLine
from .items import Item, State
from .scope import Scope
from .tally import move_count

__all__ = ["Group"]


class Group:
    __slots__ = ("counts", "live", "name", "scope", "succeeded", "waiters", "waiting")

    def __init__(self, scope: Scope, name: str) -> None:
        self.scope = scope
        self.name = name
        self.counts: dict[str, int] = {}  # state name -> members known in that state
        self.succeeded: dict[str, Item] = {}  # in the order they succeeded
        self.live: dict[str, Item] = {}  # unfinished members
        self.waiters: dict[int, WaitLine] = {}  # need -> waits for that many successes
        self.waiting = 0

    def size(self) -> int:
        return sum(self.counts.values())

    def reach(self) -> int:
        """How many members have succeeded or may still succeed."""
        return len(self.succeeded) + len(self.live)

    def moved(self, item: Item, old: State | None, new: State | None) -> None:
        """Bookkeeping for one member's move (tally.py): appliers only, writes nothing."""
        counts = self.counts
        move_count(counts, old, new)
        if new is None:
            self.succeeded.pop(item.id, None)
            self.live.pop(item.id, None)
            scope = self.scope
            if not counts and not self.waiting and scope.groups.get(self.name) is self:
                del scope.groups[self.name]
                if scope.group_pages is not None:
                    scope.group_pages.removed()
            return
        if item.terminal:
            self.live.pop(item.id, None)
            if new is State.SUCCEEDED:
                self.succeeded[item.id] = item
        else:
            self.live[item.id] = item

    def view(self) -> dict[str, Any]:
        return {
            "group": self.name,
            "tasks": self.size(),
            "counts": dict(self.counts),
            "succeeded": len(self.succeeded),
            "unfinished": len(self.live),
            "waiters": self.waiting,
        }
