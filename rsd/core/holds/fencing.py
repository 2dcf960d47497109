"""FENCE_CHECK: whether a fencing token is still its key's current grant.

A claim's lease handle is its fencing token. Users store it (or the lease's generation)
with writes to an external store and ask, before or after a write, whether it is still
the current one. The answer is one dict lookup, changes nothing and writes no record.

What always holds:
- a token is current exactly while its lease is live at the server and is the lease of
  that (run, key) of the caller's tenant: from its grant until it is released, ended
  by its expiry (the server's timer at its deadline, when no renewal came), or ended by
  the run's cancellation. A later generation is only ever granted after that;
- a lease once ended never lives again, so a token once answered ``current: false`` is
  refused for good: checks are monotonic, whatever the order they arrive in;
- the run must exist (NOT_FOUND otherwise, as for every op naming a run); a key nobody
  holds, a made-up token and another key's token are simply not current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsproto import Limits, Op

from ..ground.validate import req_handle, req_text

if TYPE_CHECKING:
    from ..ground.ids import Ids
    from ..state.tables import Applier, Handler, Tables

__all__ = ["Fencing"]


class Fencing:
    """The FENCE_CHECK op. Owned by the Core; keeps no state of its own."""

    def __init__(self, tables: Tables, ids: Ids) -> None:
        self.tables = tables
        self.ids = ids
        self.ops: dict[int, Handler] = {Op.FENCE_CHECK: self.check}
        self.appliers: dict[int, Applier] = {}

    def check(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """``{"current": bool, "generation": int}``: whether ``token`` is the live grant
        of ``key`` in run ``scope``, and the key's generation now (that of its current
        or last owner; for a key not in the table, a number no smaller than any it had)."""
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        key = req_text(args, "key", Limits.MAX_KEY_BYTES)
        token = req_handle(args, "token")
        scope = self.tables.run(self.tables.tenant_of(conn), scope_id)
        claim = scope.claims.get(key)
        if claim is None:
            return {"current": False, "generation": self.ids.generation_floor}
        lease = claim.lease
        current = lease is not None and lease.handle == token
        return {"current": current, "generation": claim.generation}
