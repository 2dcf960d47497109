"""The server-wide turn budget: how much work busy connections' input may do in a loop turn.

A connection whose buffered input takes longer than its share of a turn stops there
(``Batches``: its socket unread, the rest decoded in ``conn.backlog`` or undecoded in
its decoder) and is queued here. A turn (output.py, ``_resume``) resumes the queued
connections in the order they were cut, one slice each, until the turn budget
(``Policy.TURN_BUDGET_SECONDS``) has passed on the loop's clock: the rest stay at the
head of the queue for the next turn, and the loop polls its sockets (a bystander is
read and answered) in between. So a turn lasts about the budget plus one request
however many connections flood, not one request per flooder. Each slice is the budget
divided among the connections queued at the turn's start, but at least
``Policy.MIN_TURN_SHARE_SECONDS``, and a slice always runs at least one request.

What always holds:
- the queue is first cut, first resumed, and a turn starts with its head: a connection
  cut waits for at most the slices of those queued before it, none is skipped, so none
  starves;
- a turn resumes only connections queued before it began (one cut again during the turn
  goes to the tail, for a later turn), and at least one of them, so every turn makes
  progress and ends;
- ``share`` is recomputed once per turn (``begin``), never per request: the hot path
  reads one attribute;
- a connection is queued at most once (the caller's ``conn.yielded`` flag), so the
  queue holds at most one entry per connection.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from ..policy import Policy

__all__ = ["Turns"]

C = TypeVar("C")


class Turns(Generic[C]):
    """Round robin over the connections cut short, a bounded number of slices a turn."""

    __slots__ = ("_due", "budget", "cut", "ends", "floor", "share")

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
        self.ends = float("-inf")  # when the current turn's budget is spent
        self.cut: deque[C] = deque()  # cut short: resumed in later turns, in order
        self._due = 0  # queued before this turn began and not yet resumed in it

    def yielded(self, conn: C) -> None:
        """``conn`` used its share: it goes on in a later turn, after those queued."""
        self.cut.append(conn)

    def begin(self, now: float) -> None:
        """The start of a turn: the connections queued now are its candidates, and the
        share each (and any other busy connection) gets is set."""
        busy = self._due = len(self.cut)
        self.ends = now + self.budget
        self.share = self.budget if busy <= 1 else max(self.floor, self.budget / busy)

    def next(self, now: float, first: bool) -> C | None:
        """The next connection to resume in this turn, or None once the turn's budget has
        passed (``first``: none resumed yet, then one always is) or no one is due."""
        if not self._due or (now >= self.ends and not first):
            self._due = 0
            return None
        self._due -= 1
        return self.cut.popleft()
