"""Lines of dues that only grow, each sharing one timer-wheel entry: ``DueLine`` for
wall-clock instants (retention, tombstones), ``DeadlineLine`` for the timeouts of waits.

Every finished task is retained for the same ``retention_seconds`` and then tombstoned
for the same ``tombstone_seconds``: its next instant is its finishing time plus a
constant, and tasks finish in the order of the (monotonic) clock. Such dues arrive in
order, so a FIFO line serves them with one wheel entry for its head, instead of a
Timer object and a wheel entry per task: a deque append per task, no hashing, no heap.

What always holds:
- ``fn(now, arg)`` runs for an entry only once its wall-clock instant is not ahead of
  ``now`` (``WallClock.after``, exactly as ``at_wall`` times it), never early, and at the
  latest one wheel tick after, as for any wheel entry;
- entries fire in the order they were added (their instants are non-decreasing along
  the line); an instant earlier than the line's last (the wall clock went back between
  runs, or items placed from a snapshot in another order) gets a wheel timer of its own,
  so nothing waits behind a later instant;
- the line is on the wheel (itself, once) exactly while it is not empty, for an instant
  never later than its first entry's; ``fire`` fires at most ``Policy.MAX_FIRED_PER_TICK``
  entries and returns how many, which ``Core.tick`` counts in its budget: a mass of dues
  at one instant is fired a slice per tick, the rest still due, as for the wheel itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from ...policy import Policy
from .timerwheel import TimerWheel
from .wallclock import WallClock

__all__ = ["DeadlineLine", "DueLine", "Timed"]

_BUDGET: Final = Policy.MAX_FIRED_PER_TICK
_FIRING: Final = float("-inf")  # DeadlineLine._armed while it fires: it is off the wheel


class DueLine:
    """Calls ``fn(now, arg)`` at each entry's wall-clock instant, in order."""

    __slots__ = ("_armed", "_clock", "_fn", "_line")

    def __init__(self, clock: WallClock, fn: Callable[[float, Any], None]) -> None:
        self._clock = clock
        self._fn = fn
        self._line: deque[tuple[float, Any]] = deque()
        self._armed = False

    def __len__(self) -> int:
        return len(self._line)

    def add(self, wall_time: float, arg: Any) -> None:
        """``fn(now, arg)`` at ``wall_time``. O(1)."""
        line = self._line
        if line and wall_time < line[-1][0]:
            self._clock.at_wall(wall_time, self._fn, arg)  # out of order: its own timer
            return
        line.append((wall_time, arg))
        if not self._armed:
            self._arm(wall_time)

    def extra_timers(self) -> int:
        """Its entries beyond the one wheel entry they share (stats). O(1)."""
        return len(self._line) - 1 if self._armed else len(self._line)

    def _arm(self, wall_time: float) -> None:
        self._armed = True
        self._clock.at_wall_entry(wall_time, self)

    def fire(self, now: float) -> int:
        """The wheel entry came due: fire what is due, at most a budget; the line is on
        the wheel again for its first entry if any is left (still due if it was)."""
        # Still counted as armed while firing: entries ``fn`` adds meanwhile only join
        # the line, which is armed once, for its first entry, after.
        line, fn, after = self._line, self._fn, self._clock.after
        fired = 0
        while line and fired < _BUDGET and not after(line[0][0], now):
            fn(now, line.popleft()[1])
            fired += 1
        self._armed = False
        if line:
            self._arm(line[0][0])
        return fired


class Timed(Protocol):
    """What a ``DeadlineLine`` holds: a wait with its deadline (waits.py)."""

    deadline: float
    lined: bool  # in a deadline line: set and cleared by the line

    def fire(self, now: float) -> None: ...


class DeadlineLine:
    """Timeouts of waits in deadline order, on the wheel as one entry (itself).

    Holds only waits whose deadline is not before the line's last (``add`` says False
    for the others). A wait that ends while lined is marked (``lined`` False) and
    counted as stale; its entry is skipped when it reaches the front, and the line is
    rebuilt without such entries once they are half of it: so it never holds more than
    twice its pending waits, plus a constant. Emptied, it leaves the wheel. Its wheel
    entry is never later than its first deadline (the line grows only at its end), and
    ``fire`` times out at most ``Policy.MAX_FIRED_PER_TICK`` waits and returns how many,
    which ``Core.tick`` counts in its budget, the rest left due.
    """

    __slots__ = ("_armed", "_line", "_stale", "_wheel")

    def __init__(self, wheel: TimerWheel) -> None:
        self._wheel = wheel
        self._line: deque[Timed] = deque()
        self._stale = 0
        self._armed: float | None = None  # the deadline of its wheel entry

    def add(self, wait: Timed) -> bool:
        line = self._line
        if line and wait.deadline < line[-1].deadline:
            return False
        wait.lined = True
        line.append(wait)
        if self._armed is None:
            self._arm(wait.deadline)
        return True

    def withdraw(self, wait: Timed) -> None:
        wait.lined = False
        self._stale += 1
        line = self._line
        if self._stale == len(line):  # all ended: off the wheel too
            line.clear()
            self._stale = 0
            if self._armed is not None and self._armed != _FIRING:
                self._wheel.cancel(self._armed, self)
                self._armed = None
        elif self._stale > 32 and self._stale * 2 > len(line):
            self._line = deque(entry for entry in line if entry.lined)
            self._stale = 0

    def extra_timers(self) -> int:
        """Its pending timeouts beyond the one wheel entry they share (stats). O(1)."""
        pending = len(self._line) - self._stale
        return pending - 1 if self._armed is not None else pending

    def _arm(self, deadline: float) -> None:
        self._armed = deadline
        self._wheel.schedule(deadline, self)

    def fire(self, now: float) -> int:
        # While firing, waits added meanwhile only join the line (unless it empties:
        # then the first of them arms it), and it is armed for its first deadline after.
        self._armed = _FIRING
        line = self._line
        fired = 0
        while line and fired < _BUDGET:
            wait = line[0]
            if not wait.lined:  # it ended: its entry goes
                line.popleft()
                self._stale -= 1
                continue
            if wait.deadline > now:
                break
            line.popleft()
            wait.lined = False
            wait.fire(now)  # its end withdraws nothing more from this line
            fired += 1
        if self._armed == _FIRING:
            self._armed = None
            if line:
                self._arm(line[0].deadline)
        return fired
