"""The lease: the one mechanism behind claims and deliveries (and later pool slots).

A lease has an id that is also its fencing token: unique, never reused, handed out from
one counter that only grows. A lease is live until it is ended (released, settled) or
its ``expires_at`` passes without a renewal. Renewal only moves ``expires_at``; the
timer wheel holds exactly one entry per live lease, at ``wheel_at`` (none once it has
ended: ``end`` takes it off the wheel), and an entry that comes due for a renewed lease
is re-armed at the new deadline. So renewals, the hot path, touch no data structure but
the lease itself, and an ended lease costs the wheel nothing.
"""

from __future__ import annotations

from typing import Any

from .timerwheel import TimerWheel

__all__ = ["Lease", "LeaseTable"]


class Lease:
    __slots__ = ("conn", "expires_at", "holder", "id", "length", "owner", "wheel_at")

    def __init__(
        self, lease_id: int, owner: Any, holder: str, conn: int, length: float, now: float
    ) -> None:
        self.id = lease_id
        self.owner = owner  # the object this lease keeps (a Claim or an Item)
        self.holder = holder
        self.conn = conn  # connection that last acquired or renewed it: where pushes go
        self.length = length
        self.expires_at = now + length
        self.wheel_at = self.expires_at


class LeaseTable:
    __slots__ = ("live", "next_id", "wheel")

    def __init__(self, wheel: TimerWheel) -> None:
        self.wheel = wheel
        self.live: dict[int, Lease] = {}  # read directly only by the renewal fast path
        self.next_id = 1

    def __len__(self) -> int:
        return len(self.live)

    def get(self, lease_id: int) -> Lease | None:
        return self.live.get(lease_id)

    def add(
        self, lease_id: int, owner: Any, holder: str, conn: int, length: float, now: float
    ) -> Lease:
        lease = Lease(lease_id, owner, holder, conn, length, now)
        self.live[lease_id] = lease
        if lease_id >= self.next_id:
            self.next_id = lease_id + 1
        self.wheel.schedule(lease.expires_at, lease)
        return lease

    def renew(self, lease: Lease, now: float, length: float | None, conn: int) -> None:
        if length is not None:
            lease.length = length
        lease.expires_at = now + lease.length
        lease.conn = conn
        if lease.expires_at < lease.wheel_at:  # shortened: move its one entry earlier
            self.wheel.cancel(lease.wheel_at, lease)
            lease.wheel_at = lease.expires_at
            self.wheel.schedule(lease.expires_at, lease)

    def end(self, lease: Lease) -> None:
        if self.live.pop(lease.id, None) is lease:
            self.wheel.cancel(lease.wheel_at, lease)

    def check_expired(self, lease: Lease, now: float) -> bool:
        """Called when the wheel hands back ``lease``: True if it has now expired.

        A renewed lease is re-armed at its new deadline instead (the entry that came due
        was its only one).
        """
        if self.live.get(lease.id) is not lease:
            return False
        if lease.expires_at <= now:
            return True
        if lease.wheel_at <= now:
            lease.wheel_at = lease.expires_at
            self.wheel.schedule(lease.expires_at, lease)
        return False

    def all(self) -> list[Lease]:
        return list(self.live.values())
