"""LEASE_RENEW: renewing many leases in one request, the hot path of every client.

What always holds: the whole batch is checked before any lease is touched (one malformed
item refuses the request); a handle that is not a live lease of this connection's tenant
(stale, guessed, another tenant's) gets STALE_CLAIM in its slot and touches nothing, but
one that left this shard with its run on a slot move (forwarded.py) gets MOVED there, so
its SDK renews it on the run's new shard; a renewal writes no record unless it changes
the lease's length (LEASE_RESIZED), and moves no wheel entry (a lease's deadline is
``renewed_at + length``, read when it comes due).
The commonest frames take fast paths: one lease (one lookup, a shared reply the shell
sends pre-encoded) and a batch of plain handles (no record, no per-item parsing). Only a
miss looks at the forwarded handles, and only when a move left some.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import LEASE_HANDLE_BYTES, ErrorCode, Limits

from ..ground.leases import LeaseTable
from ..ground.tenants import DEFAULT_TENANT
from ..ground.validate import check_number, invalid, is_handle, req_list
from ..records import LeaseResized, Rec
from ..state.tables import Tables

__all__ = ["RENEWED_ONE", "STALE_ONE", "Renewals"]

_STALE: Final = ErrorCode.STALE_CLAIM.value
_MOVED: Final = ErrorCode.MOVED.value
_HANDLE: Final = LEASE_HANDLE_BYTES
# The replies to a one-lease renewal (the commonest frame), made once and shared: the
# shell packs a reply and never changes it, and ``Batches`` sends RENEWED_ONE pre-encoded.
RENEWED_ONE: Final[dict[str, list[str | None]]] = {"results": [None]}
STALE_ONE: Final[dict[str, list[str | None]]] = {"results": [_STALE]}


class Renewals:
    def __init__(self, tables: Tables, leases: LeaseTable, tenant_by_conn: dict[int, str]) -> None:
        self.tables = tables
        self.leases = leases
        self.tenant_by_conn = tenant_by_conn  # the connection's tenant (tenants.py)

    def renew(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Renew many leases in one request; each item gets its own outcome.

        The whole batch is checked before any lease is touched: one malformed item
        refuses the request. A handle that is not a live lease of this connection's
        tenant (stale, guessed, another tenant's) gets STALE_CLAIM in its slot and
        touches nothing: the tenant check here is ``Tables.own_lease``'s, inlined.
        """
        items = args.get("leases")
        if type(items) is list and len(items) == 1:  # one lease: one lookup, no list
            handle = items[0]
            if type(handle) is bytes and len(handle) == _HANDLE:
                lease = self.leases.live.get(handle)
                if lease is not None and lease.tenant == self.tenant_by_conn.get(
                    conn, DEFAULT_TENANT
                ):
                    lease.renewed_at = now
                    lease.conn = conn
                    return RENEWED_ONE
                if self.tables.forwarded.runs:  # a miss after a move: perhaps MOVED
                    return {"results": [self._missed(conn, handle)]}
                return STALE_ONE
        if type(items) is list and len(items) <= Limits.MAX_RENEW_BATCH:
            for item in items:
                if type(item) is not bytes or len(item) != _HANDLE:
                    break
            else:
                # The common batch (plain handles, same lengths): no record, no wheel work.
                results: list[str | None] = []
                append = results.append
                get = self.leases.live.get
                tenant = self.tenant_by_conn.get(conn, DEFAULT_TENANT)
                for handle in items:
                    lease = get(handle)
                    if lease is not None and lease.tenant == tenant:
                        lease.renewed_at = now  # its deadline is renewed_at + length
                        lease.conn = conn
                        append(None)
                    elif self.tables.forwarded.runs:  # a miss after a move
                        append(self._missed(conn, handle))
                    else:
                        append(_STALE)
                return {"results": results}
        return self._renew_checked(now, conn, args)

    def _renew_checked(self, now: float, conn: int, args: dict[str, Any]) -> Any:
        """``renew``'s general path (rare: a lease resized, or bad input): every item
        checked first, then each renewal and resize in order. A resize is a record."""
        items = req_list(args, "leases", Limits.MAX_RENEW_BATCH)
        shortest = self.tables.min_lease_seconds
        parsed: list[tuple[bytes, float | None]] = []
        for item in items:
            if is_handle(item):
                parsed.append((item, None))
                continue
            if not isinstance(item, list) or len(item) != 2 or not is_handle(item[0]):
                raise invalid(
                    f"each item of leases must be a lease handle (a bin of {_HANDLE} bytes) "
                    "or [lease handle, seconds]"
                )
            seconds = item[1]
            if seconds is not None:
                seconds = check_number(
                    seconds, "lease_seconds", shortest, Limits.MAX_LEASE_SECONDS
                )
            parsed.append((item[0], seconds))
        results: list[str | None] = []
        leases = self.leases
        tenant = self.tables.tenant_of(conn)
        for handle, seconds in parsed:
            lease = leases.get(handle)
            if lease is None or lease.tenant != tenant:
                results.append(self._missed(conn, handle))
                continue
            if seconds is not None and seconds != lease.length:
                self.tables.commit(LeaseResized(Rec.LEASE_RESIZED, handle, seconds), now)
            leases.renew(lease, now, seconds, conn)
            results.append(None)
        return {"results": results}

    def _missed(self, conn: int, handle: bytes) -> str:
        """The outcome of renewing ``handle``, which is no live lease of ``conn``'s
        tenant: MOVED if it left with its run on a slot move (forwarded.py), else
        STALE_CLAIM."""
        tables = self.tables
        if tables.forwarded.runs and tables.forwarded_run(handle, tables.tenant_of(conn)):
            return _MOVED
        return _STALE
