"""A claim: a key of a run, held by a lease, and the waiters in line for it.

A held claim is its own lease: ``Claim`` extends ``LeaseBase`` (leases.py), so a held
key costs one object, found by its key in its run's ``claims`` and by its handle in the
lease table. What always holds:
- the claim is held exactly while ``handle`` is not None; each grant gives the same
  object a new handle (and holder, length, deadline), so a handle of an earlier grant
  finds nothing in the lease table: STALE_CLAIM, as for a lease object that ended;
- ``lease`` is the claim itself while held, else None, and ``owner`` is the claim: code
  written for a lease kept for an owner reads a claim the same way;
- ``generation`` is that of the last owner; the next grant adds one (claimbook.py).
"""

from __future__ import annotations

from typing import Any

from ..ground.leases import LeaseBase
from ..ground.waits import Wait, WaitLine, leave_line

__all__ = ["Claim", "Waiter", "grant_view"]


class Claim(LeaseBase):
    __slots__ = ("generation", "key", "scope", "waiters")

    def __init__(self, tenant: str, scope: str, key: str, generation: int = 0) -> None:
        self.tenant = tenant
        self.scope = scope
        self.key = key
        self.generation = generation  # of the last owner; the next grant adds one
        self.handle = None  # type: ignore[assignment]  # held once granted
        # A line costs ~600 bytes: most keys never have a waiter, so share an empty tuple.
        self.waiters: WaitLine | tuple[()] = ()

    @property
    def lease(self) -> Claim | None:
        """The claim itself while it is held (its lease), else None."""
        return self if self.handle is not None else None

    @property
    def owner(self) -> Claim:
        """What this lease keeps: the claim itself."""
        return self


class Waiter(Wait):
    """An acquire parked in a claim's FIFO line."""

    __slots__ = ("bound", "claim", "holder", "length")

    def __init__(
        self, claim: Claim, conn: int, request_id: int, holder: str, length: float,
        deadline: float, since: float, bound: bool = False,
    ) -> None:
        super().__init__(conn, request_id, deadline, since)
        self.claim = claim
        self.holder = holder
        self.length = length
        self.bound = bound  # release_on_disconnect: its grant ends with its connection

    def withdraw(self) -> None:
        leave_line(self.claim, self)

    def timeout_message(self) -> str:
        return f"claim {self.claim.key!r} was still held when the wait timed out"


def grant_view(lease: LeaseBase, generation: int, waited: float = 0.0) -> dict[str, Any]:
    """The reply to a grant. ``waited_ms``: how long the request sat in line first, so
    the client can date the grant (send time + wait) without trusting transit time."""
    return {
        "lease": lease.handle,
        "generation": generation,
        "lease_seconds": lease.length,
        "waited_ms": int(waited * 1000),
    }
