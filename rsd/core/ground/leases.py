"""The lease: the one mechanism behind claims and deliveries (and later pool slots).

A lease has an id, unique per tenant and never reused, handed out from its tenant's
counter that only grows (ids.py), and a handle (its fencing token, what clients
present): the id as 8 bytes big-endian followed by 8 random bytes drawn when it was
granted (``new_handle``; the randomness is the caller's, so the core stays
deterministic, and the record of the grant carries the whole handle, so a replay
rebuilds the same one). Live leases are
found by their whole handle only, so knowing or guessing an id is no capability: a
handle with the right id and a wrong random part finds nothing, exactly like a stale
one. (A lease recovered from a journal written before handles existed has the 8-byte
id alone as its handle: no client can present it, and it lives out its length.)
A lease belongs to its owner's tenant (``tenant``).

A lease is live until it is ended (released, settled) or its ``expires_at`` passes
without a renewal. A lease keeps the instant it was last granted or renewed
(``renewed_at``) and its ``length``; ``expires_at`` is their sum, computed when asked.
Renewal only moves ``renewed_at``, to the request's ``now``, a float every lease renewed
by one batch shares, so a renewal allocates nothing. The timer wheel holds exactly one
wanted entry per live lease, in the row of ``wheel_at`` (timerwheel.py; ``wheel_at`` is
``OFF`` while the entry is handed back and not yet re-armed), and an entry that comes
due for a renewed lease is re-armed at the new deadline. An ended lease's entry is
counted stale at once (``end``) and leaves its row within O(1) amortised work, so an
ended lease costs the wheel nothing lasting. So renewals, the hot path, touch no data
structure but the lease itself.

Memory (a million held claims must fit in 400 MB): every lease field is a pointer to an
object shared with others where possible. ``renewed_at`` is the batch's ``now``; a
length is one object per distinct value (``LeaseTable`` keeps them, a bounded table);
``wheel_at`` is shared by leases granted in one batch with one length. A claim is its own
lease (``Claim`` in claim.py extends ``LeaseBase``): one object per held key, no owner
pointer; every other lease is a ``Lease`` pointing at its ``owner`` (an item, a slot).

Expiry is decided here and nowhere else (``expire``, called by ``Core.tick`` for each
lease entry the wheel hands back): a lease not renewed by its deadline is handed to the
owner of its kind (``Events.lease_expired``, events.py), keyed by the type of
``lease.owner``. The table does not know what a lease keeps; the owner ends it its own
way, by a record, and tells the holder (``Effects.lease_lost``).

A lease granted with ``release_on_disconnect`` is bound to the connection it was granted
on (``bind``): it ends the moment that connection closes (``drop_connection``), handed
to the same owner, with the reason "connection closed", as if it had expired then. The
flag is in the grant's record, so a replayed bound lease is bound to no connection
(``NO_CONN``): none survives a restart or a takeover (``Core.recovered`` drops them).
The bound leases are kept beside the table (``bound``, ``bound_by_conn``), not on the
lease, so a renewal, bound lease or not, does exactly what it did.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .ids import Counters
from .timerwheel import TimerWheel

__all__ = ["NO_CONN", "OFF", "Lease", "LeaseBase", "LeaseTable", "lease_id_of", "new_handle"]

_LENGTHS: Final = 64  # distinct lease lengths kept shared; others get an object of their own
OFF: Final = float("-inf")  # ``wheel_at`` of a lease whose entry the wheel has handed back
NO_CONN: Final = 0  # the connection of a replayed lease (connection ids start at 1)
CONNECTION_CLOSED: Final = "connection closed"  # why a bound lease ended with its connection


def new_handle(lease_id: int, random8: bytes) -> bytes:
    """The handle of lease ``lease_id``: its id, big-endian, then 8 random bytes."""
    assert len(random8) == 8
    return lease_id.to_bytes(8, "big") + random8


# A handle's first 8 bytes, read in place: compiled, ``int.from_bytes(handle[:8], "big")``
# copies the slice, looks the method up on ``int`` and parses "big" at every call.
_ID_OF: Final = struct.Struct(">Q").unpack_from


def lease_id_of(handle: bytes) -> int:
    """The lease id a handle begins with (``new_handle``); a handle shorter than 8
    bytes (none of rsd's) reads as the big-endian number of the bytes it has."""
    if len(handle) < 8:
        return int.from_bytes(handle, "big")
    lease_id: int = _ID_OF(handle)[0]
    return lease_id


class LeaseBase:
    """What every lease holds. ``handle`` is its fencing token (None for a claim nobody
    holds); ``conn`` the connection that last acquired or renewed it, where pushes go."""

    __slots__ = ("conn", "handle", "holder", "length", "renewed_at", "tenant", "wheel_at")

    handle: bytes
    holder: str
    conn: int
    length: float
    renewed_at: float
    wheel_at: float
    tenant: str

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.length

    @property
    def id(self) -> int:
        return lease_id_of(self.handle)

    if TYPE_CHECKING:  # every lease has one (a slot on Lease, a property on Claim)

        @property
        def owner(self) -> object:
            """What the lease is kept for: an item, a slot, or the claim itself (a
            lease found by its handle is told apart by ``type(lease.owner)``)."""


class Lease(LeaseBase):
    """A lease kept for another object (``owner``): a delivered item or a pool slot."""

    __slots__ = ("owner",)

    owner: Any

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.tenant = owner.tenant


class LeaseTable:
    """The live leases, and the timer wheel whose rows they are (``fresh``, ``taken``)."""

    __slots__ = (
        "_at", "_due", "_length", "_lengths", "bound", "bound_by_conn", "ids", "live",
        "owners", "wheel",
    )

    def __init__(self, owners: dict[type, Callable[[float, Any, str], None]]) -> None:
        # ``Events.lease_expired``: the owner of each kind of lease, by owner type, told
        # of its leases' expiry (or, bound ones, of their connection's end)
        self.owners = owners
        self.wheel = TimerWheel(rows=self)  # the core's one wheel: leases are its rows
        # handle -> lease; read directly only by the renewal fast path
        self.live: dict[bytes, LeaseBase] = {}
        self.ids = Counters()  # tenant -> its next lease id (ids.py)
        # One object per distinct length (per type: an int length stays an int), at most
        # ``_LENGTHS`` of them: most leases share one of a few lengths.
        self._lengths: dict[tuple[type, float], float] = {}
        # The last deadline computed, from which instant and length: the leases of one
        # batch with one length share it.
        self._at: float | None = None
        self._length: float | None = None
        self._due = 0.0
        # Leases bound to their connection (``release_on_disconnect``): handle -> the
        # connection, and each connection's bound leases.
        self.bound: dict[bytes, int] = {}
        self.bound_by_conn: dict[int, dict[bytes, LeaseBase]] = {}

    def __len__(self) -> int:
        return len(self.live)

    def get(self, handle: Any) -> LeaseBase | None:
        """The live lease with exactly this handle (anything else finds nothing)."""
        return self.live.get(handle) if type(handle) is bytes else None

    def add(
        self, handle: bytes, owner: Any, holder: str, conn: int, length: float, now: float
    ) -> Lease:
        """A new lease kept for ``owner``, live from ``now``."""
        lease = Lease(owner)
        self.hold(lease, handle, holder, conn, length, now)
        return lease

    def hold(
        self, lease: LeaseBase, handle: bytes, holder: str, conn: int, length: float,
        now: float,
    ) -> None:
        """Make ``lease`` live under ``handle`` from ``now`` (a new Lease, or a Claim
        granted again: its one object takes each new handle)."""
        lease.handle = handle
        lease.holder = holder
        lease.conn = conn
        length = lease.length = self.shared_length(length)
        lease.renewed_at = now
        self.live[handle] = lease
        self.ids.took(lease.tenant, lease_id_of(handle))
        due = lease.wheel_at = self._deadline(now, length)
        self.wheel.schedule_row(due, lease)

    def shared_length(self, length: float) -> float:
        """The one object kept for this length (equal values of one type share it)."""
        last = self._length  # the one a deadline was last reckoned with: most often this
        if type(length) is type(last) and length == last:
            return last
        key = (type(length), length)
        kept = self._lengths.get(key)
        if kept is not None:
            return kept
        if len(self._lengths) < _LENGTHS:
            self._lengths[key] = length
        return length

    def _deadline(self, at: float, length: float) -> float:
        """``at + length``, the same object for consecutive calls with the same pair."""
        if at is not self._at or length is not self._length:
            self._at = at
            self._length = length
            self._due = at + length
        return self._due

    def renew(self, lease: LeaseBase, now: float, length: float | None, conn: int) -> None:
        if length is not None:
            lease.length = self.shared_length(length)
        lease.renewed_at = now
        lease.conn = conn
        expires_at = now + lease.length
        if expires_at < lease.wheel_at:  # shortened: move its one entry earlier
            wheel = self.wheel
            wheel.cancel_row(lease.wheel_at)
            due = lease.wheel_at = self._deadline(now, lease.length)
            wheel.schedule_row(due, lease)

    def end(self, lease: LeaseBase) -> None:
        if self.live.pop(lease.handle, None) is lease and lease.wheel_at != OFF:
            self.wheel.cancel_row(lease.wheel_at)
        if self.bound:
            self._unbind(lease.handle)

    # ---- leases bound to their connection ----------------------------------------------

    def bind(self, lease: LeaseBase, conn: int) -> None:
        """``lease`` (live) ends when connection ``conn`` closes (``NO_CONN``: a replayed
        lease, which ends at ``Core.recovered``). Binding again moves it."""
        handle = lease.handle
        self._unbind(handle)
        self.bound[handle] = conn
        self.bound_by_conn.setdefault(conn, {})[handle] = lease

    def is_bound(self, lease: LeaseBase) -> bool:
        return lease.handle in self.bound

    def _unbind(self, handle: bytes) -> None:
        conn = self.bound.pop(handle, None)
        if conn is not None:
            mine = self.bound_by_conn[conn]
            del mine[handle]
            if not mine:
                del self.bound_by_conn[conn]

    def drop_connection(self, conn: int, now: float) -> int:
        """Connection ``conn`` closed: each live lease bound to it is handed to the owner
        of its kind, as at expiry (``lease_expired``), with the reason "connection
        closed". The one place a lease ends with its connection. O(its bound leases);
        returns how many ended."""
        mine = self.bound_by_conn.get(conn)
        if not mine:
            return 0
        ended = 0
        for handle, lease in list(mine.items()):
            if self.live.get(handle) is lease:
                self.owners[type(lease.owner)](now, lease, CONNECTION_CLOSED)
                ended += 1
            self._unbind(handle)  # (the owner's end record has, if it ended it)
        return ended

    def expire(self, lease: LeaseBase, now: float) -> None:
        """The wheel handed back ``lease``'s entry: if it has expired by ``now``, its
        owner is told (``lease_expired``); a renewed lease is re-armed at its new
        deadline instead (the entry that came due was its only one). The one place a
        lease's expiry is decided."""
        if self.live.get(lease.handle) is not lease:
            return
        renewed_at = lease.renewed_at
        if renewed_at + lease.length <= now:
            self.owners[type(lease.owner)](now, lease, "expired")
            return
        if lease.wheel_at <= now:  # OFF: handed back, not re-armed yet
            due = lease.wheel_at = self._deadline(renewed_at, lease.length)
            self.wheel.schedule_row(due, lease)

    def taken(self, lease: LeaseBase) -> None:
        """The wheel handed ``lease``'s entry back: it has none until re-armed."""
        lease.wheel_at = OFF

    def fresh(self, lease: LeaseBase, slot: int) -> bool:
        """Whether a row entry at ``slot`` is ``lease``'s one wanted entry: live, on
        the wheel, at that slot (an ended lease's, or a claim's of an earlier grant,
        is not)."""
        return (
            self.live.get(lease.handle) is lease
            and lease.wheel_at != OFF
            and self.wheel.slot_of(lease.wheel_at) == slot
        )

    def all(self) -> list[LeaseBase]:
        return list(self.live.values())
