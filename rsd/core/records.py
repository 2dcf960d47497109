"""Journal record types: every state change the core makes is one of these.

A record is a tuple whose first element is its type. Live operation and recovery go
through the same ``apply`` path, so replaying the journal rebuilds the same state.
Records carry everything needed to apply them without looking at the request that
caused them, and applying one twice is harmless (a grant for a lease id that is already
known, or an end for a lease that is gone, changes nothing).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Rec"]


class Rec(IntEnum):
    # (SCOPE_CREATED, scope_id, wall_time)
    SCOPE_CREATED = 1
    # (CLAIM_GRANTED, scope_id, key, lease_id, generation, holder, lease_seconds)
    CLAIM_GRANTED = 2
    # (LEASE_ENDED, lease_id, reason)  reason: "released" | "expired"
    LEASE_ENDED = 3
    # (LEASE_RESIZED, lease_id, lease_seconds)  a renewal that changed the lease length
    LEASE_RESIZED = 4
