"""The server-wide turn budget: how long one connection's input may run in a loop turn.

A connection whose buffered input takes longer than its share of a turn stops there
(``Batches``: its socket unread, the rest decoded in ``conn.backlog`` or undecoded in
its decoder) and goes on at the next turn, after everyone else who was also cut. The
share is the turn budget divided among the connections cut in the previous turn, so a
turn lasts about ``Policy.TURN_BUDGET_SECONDS`` however many connections flood, until
each gets only ``Policy.MIN_TURN_SHARE_SECONDS`` (then a turn grows with their number,
``MIN_TURN_SHARE_SECONDS`` each).

What always holds:
- every connection cut in a turn runs again in the next one, in the order they were cut
  (first cut, first resumed): none is skipped, so none starves;
- ``share`` is recomputed once per turn (``take``), never per request: the hot path reads
  one attribute;
- a connection is queued at most once per turn (the caller's ``conn.yielded`` flag), so
  the queue holds at most one entry per connection.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from .policy import Policy

__all__ = ["Turns"]

C = TypeVar("C")


class Turns(Generic[C]):
    """Round robin over the connections cut short in a turn, and each one's share."""

    __slots__ = ("budget", "cut", "floor", "share")

    def __init__(
        self,
        budget: float = Policy.TURN_BUDGET_SECONDS,
        floor: float = Policy.MIN_TURN_SHARE_SECONDS,
    ) -> None:
        if not 0 < floor <= budget:
            raise ValueError(f"need 0 < floor ({floor}) <= budget ({budget})")
        self.budget = budget
        self.floor = floor
        self.share = budget  # what one connection may run for in the current turn
        self.cut: deque[C] = deque()  # cut short this turn: resumed next turn, in order

    def yielded(self, conn: C) -> None:
        """``conn`` used its share of this turn: it goes on at the next one."""
        self.cut.append(conn)

    def take(self) -> list[C]:
        """The start of a turn: the connections cut in the last one, in the order they
        were cut, and the share each (and any other busy connection) gets now."""
        cut = list(self.cut)
        self.cut.clear()
        busy = len(cut)
        if busy <= 1:
            self.share = self.budget
        else:
            self.share = max(self.floor, self.budget / busy)
        return cut
