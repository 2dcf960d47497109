"""A pool, the owner of each slot's lease, and a waiter in a pool's line: the objects
the pool rules (poolbook.py) keep.

What always holds: a ``Pool``'s ``holders`` are its live slot leases in grant order (at
most ``size`` granted by the pool itself); its ``waiters`` is a line only while someone
waits (the shared empty tuple otherwise); a ``Slot`` belongs to its pool's tenant.
"""

from __future__ import annotations

from typing import Any

from ..ground.leases import Lease
from ..ground.waits import Wait, WaitLine, leave_line

__all__ = ["Pool", "PoolWaiter", "Slot", "holder_row"]


class Pool:
    __slots__ = ("generation", "holders", "name", "size", "tenant", "waiters")

    def __init__(self, tenant: str, name: str, size: int, generation: int) -> None:
        self.tenant = tenant
        self.name = name
        self.size = size
        self.generation = generation  # of the last grant; the next one adds one
        self.holders: dict[bytes, Lease] = {}  # lease handle -> live slot lease, grant order
        self.waiters: WaitLine | tuple[()] = ()  # a line only while someone waits

    def has_free_slot(self) -> bool:
        """Whether an acquire made now is granted at once (nobody waits, room left)."""
        return not self.waiters and len(self.holders) < self.size


class Slot:
    """The owner of a slot's lease: which pool, for which run, at which generation."""

    __slots__ = ("generation", "pool", "scope", "tenant")

    def __init__(self, pool: Pool, scope: str, generation: int) -> None:
        self.pool = pool
        self.scope = scope
        self.generation = generation
        self.tenant = pool.tenant  # the lease's tenant (leases.py reads it from its owner)


class PoolWaiter(Wait):
    """A POOL_ACQUIRE parked in a pool's FIFO line."""

    __slots__ = ("bound", "holder", "length", "pool", "scope")

    def __init__(
        self, pool: Pool, scope: str, conn: int, request_id: int, holder: str, length: float,
        deadline: float, since: float, bound: bool = False,
    ) -> None:
        super().__init__(conn, request_id, deadline, since)
        self.pool = pool
        self.scope = scope
        self.holder = holder
        self.length = length
        self.bound = bound  # release_on_disconnect: its grant ends with its connection

    def withdraw(self) -> None:
        leave_line(self.pool, self)

    def timeout_message(self) -> str:
        return f"pool {self.pool.name!r} had no free slot when the wait timed out"


def holder_row(lease: Lease, expires_at: float, bound: bool = False) -> dict[str, Any]:
    """POOL_INSPECT's row for one holder (``expires_at`` in wall-clock seconds; ``bound``:
    the lease ends with its connection): a slot of its own, or a delivery's lease holding
    it (``item``: the task or message run)."""
    slot = lease.owner
    own = type(slot) is Slot
    row = {
        "holder": lease.holder,
        "run": slot.scope if own else getattr(slot, "scope", None),
        "generation": slot.generation if own else None,
        "expires_at": expires_at,
        "release_on_disconnect": bound,
    }
    if not own:
        row["item"] = getattr(slot, "id", None)
    return row
