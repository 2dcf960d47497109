"""Records of files written before format version 3, brought to today's layouts.

Format version 3 (logfile.py) added two things to records: the tenant each object
belongs to, and lease handles where lease ids were. Files of versions 1 and 2 are
still read: recovery passes each of their records through ``upgrade`` before applying
it, so the appliers know one layout only (records.py).

What always holds:
- an object of an old file belongs to ``DEFAULT_TENANT``, the tenant every connection
  has without a tokens file (the only way rsd ran before tenants);
- an old lease id becomes an 8-byte handle (the id alone, big-endian): a lease
  recovered so is found by its records and ends as they say, but no client can
  present it (every handle on the wire has 16 bytes), so it is never renewed and lives
  out the one lease length every recovered lease gets; its holder, which spoke the
  older protocol, could not have renewed it anyway;
- ``upgrade`` is pure, and applying an upgraded record twice is as harmless as any.
"""

from __future__ import annotations

from typing import Any

from .records import Rec
from .tenants import DEFAULT_TENANT

__all__ = ["RECORDS_VERSION", "downgrade", "upgrade"]

RECORDS_VERSION = 3  # the file format version whose records have today's layouts

# Record types that gained the tenant as their last field.
_TENANT_LAST = frozenset({
    Rec.SCOPE_CREATED, Rec.CLAIM_GRANTED, Rec.SCOPE_CANCELLED, Rec.MAILBOX_ENSURED,
    Rec.ITEM_ENQUEUED, Rec.DEDUPE_EXPIRED, Rec.SNAP_SCOPE, Rec.SNAP_CLAIM, Rec.SNAP_ITEM,
    Rec.SNAP_DEDUPE, Rec.SNAP_DEAD_LETTER,
})
# Record type -> the position of its lease id, now a handle.
_LEASE_AT = {
    Rec.CLAIM_GRANTED: 3, Rec.LEASE_ENDED: 1, Rec.LEASE_RESIZED: 1, Rec.DELIVERED: 2,
    Rec.REQUEUED: 2, Rec.SNAP_CLAIM: 4,
}
_SNAP_ITEM_DELIVERY = 19  # (lease id, holder, lease seconds) | None


def old_handle(lease_id: Any) -> Any:
    """The handle of a lease recorded by id (see the module docstring)."""
    return lease_id.to_bytes(8, "big") if type(lease_id) is int and lease_id >= 0 else lease_id


def upgrade(rec: list[Any]) -> list[Any]:
    """``rec`` (as read from a file of format version 1 or 2) in today's layout."""
    kind = rec[0]
    if kind not in _TENANT_LAST and kind not in _LEASE_AT:
        return rec
    rec = list(rec)
    at = _LEASE_AT.get(kind)
    if at is not None and len(rec) > at:
        rec[at] = old_handle(rec[at])
    if kind == Rec.SNAP_ITEM and len(rec) > _SNAP_ITEM_DELIVERY:
        delivery = rec[_SNAP_ITEM_DELIVERY]
        if delivery is not None:
            rec[_SNAP_ITEM_DELIVERY] = [old_handle(delivery[0]), *delivery[1:]]
    if kind in _TENANT_LAST:
        rec.append(DEFAULT_TENANT)
    return rec


def downgrade(rec: list[Any]) -> list[Any]:
    """``rec`` in the layout of format versions 1 and 2: the inverse of ``upgrade`` for
    the default tenant (a handle keeps only its id). For tests and benchmarks that need
    old files, like the encoders of logfile_v1.py; rsd never writes them."""
    kind = rec[0]
    if kind not in _TENANT_LAST and kind not in _LEASE_AT:
        return rec
    rec = list(rec)
    if kind == Rec.SNAP_SCOPE:
        del rec[5:]  # the quiet window's instant (runends.py) came after version 4
    if kind in _TENANT_LAST:
        assert rec[-1] == DEFAULT_TENANT, "only the default tenant existed before version 3"
        rec.pop()
    at = _LEASE_AT.get(kind)
    if at is not None and type(rec[at]) is bytes:
        rec[at] = int.from_bytes(rec[at][:8], "big")
    if kind == Rec.SNAP_ITEM and rec[_SNAP_ITEM_DELIVERY] is not None:
        delivery = rec[_SNAP_ITEM_DELIVERY]
        rec[_SNAP_ITEM_DELIVERY] = [int.from_bytes(delivery[0][:8], "big"), *delivery[1:]]
    return rec
