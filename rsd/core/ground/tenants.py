"""Tenants: whose objects are whose, who may do what, and how much each may hold.

Every run (scope), mailbox definition, claim, task, message, delivery and lease belongs
to the tenant of the connection that made it. The shell says which tenant and role a
connection has (``connect``, after HELLO); without a tokens file every connection is
``DEFAULT_TENANT`` with admin rights.

What always holds:
- the books key their tables by tenant (a scope by ``(tenant, scope id)``, a mailbox
  definition by ``(tenant, name)``) so another tenant's object is simply not there: a
  request naming it gets the very answer a missing one gets, same code, same message;
  objects found by a global id (tasks, leases) are checked by ``owns``, the one place
  of that rule;
- tenant names are interned (``name``): every object of one tenant shares one string,
  and comparing them is an identity check in the common case;
- each tenant's counts of runs, claims, items and waits are counters kept up to date by
  the books as objects come and go (O(1), never a walk), and a request that would take
  a tenant past its limit is refused with RESOURCE_EXHAUSTED naming the limit, before
  anything changes. Replaying records never refuses: the limits bound what a client can
  ask for, not what the journal holds;
- each tenant's stored payload bytes (``Usage.bytes``: task and message data, recorded
  outcomes, dead letters' data, each the encoded size the payload check measured, none
  counted for nil; and tasks' subscriptions, by the UTF-8 length of id and scope) are
  charged where a payload is stored and given back where it is dropped (``charge``),
  and a request that would take the tenant past its byte limit is refused
  (``room_for_bytes``) before anything changes. Endings rsd makes itself (a dead letter)
  are never refused: a dead letter is charged on top, so a tenant holds at most twice
  its limit (each item it was allowed ends once);
- admin-only ops refuse a client connection with PERMISSION_DENIED (``require_admin``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Protocol

from rsproto import ErrorCode

from ...policy import Policy
from .errors import CoreError

__all__ = ["DEFAULT_TENANT", "MAX_TENANT_BYTES", "TenantLimits", "Tenants", "Usage"]

DEFAULT_TENANT: Final = "default"
MAX_TENANT_BYTES: Final = 128  # a tenant named in a request (SCOPE_CANCEL by an admin)


@dataclass(frozen=True)
class TenantLimits:
    """How much one tenant may hold at once (defaults: ``Policy``)."""

    runs: int = Policy.MAX_RUNS_PER_TENANT
    claims: int = Policy.MAX_CLAIMS_PER_TENANT
    items: int = Policy.MAX_ITEMS_PER_TENANT
    waits: int = Policy.MAX_WAITS_PER_TENANT
    mailboxes: int = Policy.MAX_MAILBOXES_PER_TENANT
    payload_bytes: int = Policy.MAX_PAYLOAD_BYTES_PER_TENANT
    limit_keys: int = Policy.MAX_LIMIT_KEYS_PER_TENANT  # work/keylimits.py


_WHAT: Final = {
    "runs": "runs (scopes)",
    "claims": "held claims",
    "items": "tasks and messages",
    "waits": "pending waits",
    "mailboxes": "mailboxes",
}
BYTES_LIMIT: Final = "max_payload_bytes_per_tenant"


class Usage:
    """One tenant's counts, kept by the books as objects come and go."""

    __slots__ = ("bytes", "claims", "items", "mailboxes", "runs", "waits")

    def __init__(self) -> None:
        self.bytes = 0  # stored payload bytes (``Tenants.charge``)
        self.runs = 0
        self.claims = 0
        self.items = 0
        self.waits = 0
        self.mailboxes = 0

    def view(self) -> dict[str, int]:
        return {"runs": self.runs, "claims": self.claims, "items": self.items,
                "waits": self.waits, "mailboxes": self.mailboxes,
                "payload_bytes": self.bytes}


class Tenanted(Protocol):
    """Anything that belongs to a tenant (a task, a lease)."""

    @property
    def tenant(self) -> str: ...


class Tenants:
    """Connections' tenants and roles, tenants' usage and limits. Owned by ``Tables``."""

    __slots__ = (
        "admins", "by_conn", "byte_limits", "limits", "names", "usage", "usage_by_conn",
    )

    def __init__(self, limits: TenantLimits) -> None:
        self.limits = limits
        self.by_conn: dict[int, str] = {}  # connection id -> its tenant (read on hot paths)
        self.admins: set[int] = set()  # connections with admin rights
        self.names: dict[str, str] = {DEFAULT_TENANT: DEFAULT_TENANT}
        self.usage: dict[str, Usage] = {}
        # connection id -> its tenant's Usage (one entry per connection, like ``by_conn``):
        # a wait's count moves with one lookup (waits.py)
        self.usage_by_conn: dict[int, Usage] = {}
        # tenant -> its own payload byte limit (the tokens file), else limits.payload_bytes
        self.byte_limits: dict[str, int] = {}

    # ---- connections -----------------------------------------------------------------

    def connect(self, conn: int, tenant: str, admin: bool) -> None:
        self.by_conn[conn] = self.name(tenant)
        self.usage_by_conn[conn] = self.of_tenant(tenant)
        if admin:
            self.admins.add(conn)
        else:
            self.admins.discard(conn)

    def disconnect(self, conn: int) -> None:
        self.by_conn.pop(conn, None)
        self.usage_by_conn.pop(conn, None)
        self.admins.discard(conn)

    def of(self, conn: int) -> str:
        """The tenant of ``conn`` (DEFAULT_TENANT for a connection never introduced:
        only the core's own tests call without ``connect``)."""
        return self.by_conn.get(conn, DEFAULT_TENANT)

    def is_admin(self, conn: int) -> bool:
        return conn in self.admins or conn not in self.by_conn

    def require_admin(self, conn: int, what: str) -> None:
        if not self.is_admin(conn):
            raise CoreError(
                ErrorCode.PERMISSION_DENIED,
                f"{what} is an admin operation; this connection's token has the client role",
            )

    def owns(self, conn: int, obj: Tenanted) -> bool:
        """Whether ``obj`` (anything with a ``tenant``) is ``conn``'s tenant's: the one
        check for objects found by a global id (tasks, leases)."""
        return obj.tenant == self.by_conn.get(conn, DEFAULT_TENANT)

    # ---- names and usage -------------------------------------------------------------

    def name(self, tenant: str) -> str:
        """The one shared string for ``tenant`` (records decode a copy each)."""
        return self.names.setdefault(tenant, tenant)

    def usage_of(self, conn: int) -> Usage:
        """The Usage of ``conn``'s tenant (``of``'s, for a connection never introduced)."""
        usage = self.usage_by_conn.get(conn)
        return usage if usage is not None else self.of_tenant(DEFAULT_TENANT)

    def of_tenant(self, tenant: str) -> Usage:
        usage = self.usage.get(tenant)
        if usage is None:
            usage = self.usage[self.name(tenant)] = Usage()
        return usage

    def room(self, tenant: str, kind: str, more: int = 1) -> None:
        """Refuse (RESOURCE_EXHAUSTED) if ``tenant`` cannot take ``more`` of ``kind``
        (runs, claims, items, waits, mailboxes) without passing its limit."""
        usage = self.usage.get(tenant)
        have = getattr(usage, kind) if usage is not None else 0
        limit = getattr(self.limits, kind)
        if have + more > limit:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"tenant {tenant!r} holds {have} {_WHAT[kind]}, its limit "
                f"(max_{kind}_per_tenant is {limit})",
                {"limit": f"max_{kind}_per_tenant", "value": limit},
            )

    # ---- stored payload bytes --------------------------------------------------------

    def charge(self, tenant: str, size: int) -> None:
        """``tenant`` now stores ``size`` more payload bytes (fewer when negative): called
        by the books, live and in replay, where a payload is kept and where it is dropped.
        Never refuses (``room_for_bytes`` is the handlers' check)."""
        if size:
            self.of_tenant(tenant).bytes += size

    def set_byte_limits(self, default: int, per_tenant: dict[str, int]) -> list[str]:
        """Configuration (start, SIGHUP): every tenant's payload byte limit is
        ``per_tenant``'s, else ``default``. Bytes already stored are kept (the limit
        refuses what comes next). Returns what changed, as phrases for the log."""
        changed = []
        if default != self.limits.payload_bytes:
            self.limits = replace(self.limits, payload_bytes=default)
            changed.append(f"{BYTES_LIMIT} {default}")
        if per_tenant != self.byte_limits:
            self.byte_limits = dict(per_tenant)
            changed.append(f"{BYTES_LIMIT} of {len(per_tenant)} tenants from the tokens file")
        return changed

    def byte_limit(self, tenant: str) -> int:
        return self.byte_limits.get(tenant, self.limits.payload_bytes)

    def room_for_bytes(self, tenant: str, size: int) -> None:
        """Refuse (RESOURCE_EXHAUSTED, naming the limit and the usage) a request that
        would store ``size`` more payload bytes than ``tenant``'s limit leaves room for."""
        if not size:
            return
        usage = self.usage.get(tenant)
        have = usage.bytes if usage is not None else 0
        limit = self.byte_limits.get(tenant, self.limits.payload_bytes)
        if have + size > limit:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"tenant {tenant!r} stores {have} payload bytes and this request adds "
                f"{size}: past its limit ({BYTES_LIMIT} is {limit}); free some "
                "(results are dropped after the retention window) or raise the limit",
                {"limit": BYTES_LIMIT, "value": limit, "usage": have},
            )
