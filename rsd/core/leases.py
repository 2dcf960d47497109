"""The lease: the one mechanism behind claims and deliveries (and later pool slots).

A lease has an id, unique and never reused, handed out from one counter that only
grows, and a handle (its fencing token, what clients present): the id as 8 bytes
big-endian followed by 8 random bytes drawn when it was granted (``new_handle``; the
randomness is the caller's, so the core stays deterministic, and the record of the
grant carries the whole handle, so a replay rebuilds the same one). Live leases are
found by their whole handle only, so knowing or guessing an id is no capability: a
handle with the right id and a wrong random part finds nothing, exactly like a stale
one. (A lease recovered from a journal written before handles existed has the 8-byte
id alone as its handle: no client can present it, and it lives out its length.)
A lease belongs to its owner's tenant (``tenant``).

A lease is live until it is ended (released, settled) or its ``expires_at`` passes
without a renewal. Renewal only moves ``expires_at``; the timer wheel holds exactly one
entry per live lease, at ``wheel_at`` (none once it has ended: ``end`` takes it off the
wheel), and an entry that comes due for a renewed lease is re-armed at the new deadline.
So renewals, the hot path, touch no data structure but the lease itself, and an ended
lease costs the wheel nothing.
"""

from __future__ import annotations

from typing import Any

from .timerwheel import TimerWheel

__all__ = ["Lease", "LeaseTable", "lease_id_of", "new_handle"]


def new_handle(lease_id: int, random8: bytes) -> bytes:
    """The handle of lease ``lease_id``: its id, big-endian, then 8 random bytes."""
    assert len(random8) == 8
    return lease_id.to_bytes(8, "big") + random8


def lease_id_of(handle: bytes) -> int:
    return int.from_bytes(handle[:8], "big")


class Lease:
    __slots__ = (
        "conn", "expires_at", "handle", "holder", "length", "owner", "tenant", "wheel_at",
    )

    def __init__(
        self, handle: bytes, owner: Any, holder: str, conn: int, length: float, now: float
    ) -> None:
        self.handle = handle
        self.owner = owner  # the object this lease keeps (a Claim or an Item)
        self.tenant: str = owner.tenant
        self.holder = holder
        self.conn = conn  # connection that last acquired or renewed it: where pushes go
        self.length = length
        self.expires_at = now + length
        self.wheel_at = self.expires_at

    @property
    def id(self) -> int:
        return lease_id_of(self.handle)


class LeaseTable:
    __slots__ = ("live", "next_id", "wheel")

    def __init__(self, wheel: TimerWheel) -> None:
        self.wheel = wheel
        # handle -> lease; read directly only by the renewal fast path
        self.live: dict[bytes, Lease] = {}
        self.next_id = 1

    def __len__(self) -> int:
        return len(self.live)

    def get(self, handle: Any) -> Lease | None:
        """The live lease with exactly this handle (anything else finds nothing)."""
        return self.live.get(handle) if type(handle) is bytes else None

    def add(
        self, handle: bytes, owner: Any, holder: str, conn: int, length: float, now: float
    ) -> Lease:
        lease = Lease(handle, owner, holder, conn, length, now)
        self.live[handle] = lease
        lease_id = lease_id_of(handle)
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
        if self.live.pop(lease.handle, None) is lease:
            self.wheel.cancel(lease.wheel_at, lease)

    def check_expired(self, lease: Lease, now: float) -> bool:
        """Called when the wheel hands back ``lease``: True if it has now expired.

        A renewed lease is re-armed at its new deadline instead (the entry that came due
        was its only one).
        """
        if self.live.get(lease.handle) is not lease:
            return False
        if lease.expires_at <= now:
            return True
        if lease.wheel_at <= now:
            lease.wheel_at = lease.expires_at
            self.wheel.schedule(lease.expires_at, lease)
        return False

    def all(self) -> list[Lease]:
        return list(self.live.values())
