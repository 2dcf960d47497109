"""A line of wall-clock dues that only grow, sharing one timer-wheel entry.

Every finished task is retained for the same ``retention_seconds`` and then tombstoned
for the same ``tombstone_seconds``: its next instant is its finishing time plus a
constant, and tasks finish in the order of the (monotonic) clock. Such dues arrive in
order, so a FIFO line serves them with one wheel entry for its head, instead of a
Timer object and a wheel entry per task: a deque append per task, no hashing, no heap.

What always holds:
- ``fn(now, arg)`` runs for an entry only once its wall-clock instant is not ahead of
  ``now`` (``Tables.after``, exactly as ``at_wall`` times it), never early, and at the
  latest one wheel tick after, as for any wheel entry;
- entries fire in the order they were added (their instants are non-decreasing along
  the line); an instant earlier than the line's last (the wall clock went back between
  runs, or items placed from a snapshot in another order) gets a wheel timer of its own,
  so nothing waits behind a later instant;
- at most ``Policy.MAX_FIRED_PER_TICK`` entries fire per wheel entry: a mass of dues at
  one instant is fired over several loop turns, as ``Core.tick`` fires the wheel;
- the line has its wheel entry exactly when it is not empty (``_armed``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..policy import Policy
from .tables import Tables
from .timerwheel import Timer

__all__ = ["DueLine"]

_BUDGET = Policy.MAX_FIRED_PER_TICK


class DueLine:
    """Calls ``fn(now, arg)`` at each entry's wall-clock instant, in order."""

    __slots__ = ("_armed", "_fn", "_line", "_tables", "_timer")

    def __init__(self, tables: Tables, fn: Callable[[float, Any], None]) -> None:
        self._tables = tables
        self._fn = fn
        self._line: deque[tuple[float, Any]] = deque()
        self._timer = Timer(self._due, None)
        self._armed = False

    def __len__(self) -> int:
        return len(self._line)

    def add(self, wall_time: float, arg: Any) -> None:
        """``fn(now, arg)`` at ``wall_time``. O(1)."""
        line = self._line
        if line and wall_time < line[-1][0]:
            self._tables.at_wall(wall_time, self._fn, arg)  # out of order: its own timer
            return
        line.append((wall_time, arg))
        if not self._armed:
            self._armed = True
            self._tables.at_wall(wall_time, self._due, None)

    def _due(self, now: float, _: None) -> None:
        """The head's instant came: fire what is due (a bounded number), then arm the
        wheel for what is left. Armed all along, so an entry added meanwhile (by ``fn``)
        only joins the line."""
        line, fn, after = self._line, self._fn, self._tables.after
        fired = 0
        while line and not after(line[0][0], now):
            if fired >= _BUDGET:  # the rest at the next tick, after others had theirs
                wheel = self._tables.wheel
                wheel.schedule(now + wheel.tick, self._timer)
                return
            fn(now, line.popleft()[1])
            fired += 1
        if line:
            self._tables.at_wall(line[0][0], self._due, None)
        else:
            self._armed = False
