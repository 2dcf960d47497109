"""A quota: a tenant's token bucket, refilled continuously, and its line of waiters.

The object the quota rules (quotabook.py) keep. Its state is ``level`` at the wall-clock
instant ``level_wall``; at any later instant the level is ``min(limit, level + elapsed *
limit / per_seconds)``. ``waiters`` is a line only while someone waits (the shared empty
tuple otherwise).
"""

from __future__ import annotations

from ..ground.waits import WaitLine

__all__ = ["Quota", "QuotaKey"]

QuotaKey = tuple[str, str]  # (tenant, name)


class Quota:
    __slots__ = (
        "level", "level_wall", "limit", "name", "per_seconds", "tenant", "timer_at", "waiters",
    )

    def __init__(
        self, tenant: str, name: str, limit: int, per_seconds: float, level: float,
        level_wall: float,
    ) -> None:
        self.tenant = tenant
        self.name = name
        self.limit = limit
        self.per_seconds = per_seconds
        self.level = level  # tokens at ``level_wall``
        self.level_wall = level_wall
        self.waiters: WaitLine | tuple[()] = ()
        self.timer_at: float | None = None  # wall instant the head waiter's timer is set for

    def level_at(self, wall: float) -> float:
        """The level at wall-clock instant ``wall`` (never below the recorded one)."""
        elapsed = wall - self.level_wall
        if elapsed <= 0:
            return self.level
        return min(float(self.limit), self.level + elapsed * self.limit / self.per_seconds)

    def enough(self, level: float, amount: int) -> bool:
        """Whether ``level`` covers ``amount``, forgiving float rounding at the instant the
        refill reaches it."""
        return level + 1e-9 * self.limit >= amount

    def ready_wall(self, amount: int) -> float:
        """The wall instant at which ``amount`` is there, counting from the last record."""
        missing = amount - self.level
        if missing <= 0:
            return self.level_wall
        return self.level_wall + missing * self.per_seconds / self.limit
