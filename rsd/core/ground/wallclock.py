"""The core's wall clock: monotonic ``now`` as wall-clock seconds, and wheel timers for
wall-clock instants.

Persisted instants (deadlines, retention, quiet windows, backoffs) are wall clock, so
that they mean the same after a restart; the core is driven by monotonic ``now``. The
shell gives the offset between the two once, at start (``wall = now + offset``); the
core never reads a clock.

What always holds: ``at_wall`` schedules ``fn(now, arg)`` for the first ``now`` at which
``after(wall_time, now)`` is False, computed the same way, so a timer that fired never
finds its instant still ahead (and is re-armed by nobody by mistake).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .timerwheel import Timer, TimerWheel

__all__ = ["WallClock"]


class WallClock:
    __slots__ = ("offset", "wheel")

    def __init__(self, offset: float, wheel: TimerWheel) -> None:
        self.offset = offset  # wall clock = now + offset
        self.wheel = wheel

    def wall(self, now: float) -> float:
        """Monotonic ``now`` as wall-clock seconds."""
        return now + self.offset

    def at_wall(self, wall_time: float, fn: Callable[[float, Any], None], arg: Any) -> None:
        """Schedule ``fn(now, arg)`` for a wall-clock instant."""
        self.wheel.schedule(wall_time - self.offset, Timer(fn, arg))

    def cancel_at_wall(
        self, wall_time: float, fn: Callable[[float, Any], None], arg: Any
    ) -> None:
        """Take back what ``at_wall(wall_time, fn, arg)`` scheduled, if still there."""
        self.wheel.cancel(wall_time - self.offset, Timer(fn, arg))

    def at_wall_entry(self, wall_time: float, entry: Any) -> None:
        """Put ``entry`` (anything with ``fire(now)``) on the wheel for a wall instant."""
        self.wheel.schedule(wall_time - self.offset, entry)

    def after(self, wall_time: float, now: float) -> bool:
        """Whether a wall-clock instant is still ahead of ``now``, computed exactly as
        ``at_wall`` schedules it, so that a timer that fired never finds it ahead."""
        return wall_time - self.offset > now
