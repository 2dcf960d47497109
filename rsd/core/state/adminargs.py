"""What every admin op reads before anything else (admin.py, deadletters.py): who may ask,
which tenant, which run, which page. One place, so the admin ops cannot drift apart on
these rules.

What always holds:
- a client-role connection is refused (PERMISSION_DENIED) before any argument is read;
- the tenant is the one named in ``tenant`` (an admin may name any), else the caller's;
- a run that tenant does not have is NOT_FOUND, the same answer as a missing one;
- a page's ``cursor`` is 0 or a cursor a listing gave, its ``limit`` 1 to
  ``Policy.ADMIN_PAGE_MAX``, and it looks at no more than ``limit *
  Policy.ADMIN_SCAN_FACTOR`` entries (pages.py), from the oldest, or from the newest
  with ``newest_first``; a listing of payloads weighs each object and stops a page
  before ``Policy.PAGE_PAYLOAD_BYTES`` (so its reply fits a frame). SCHEDULE_LIST, a
  client's listing, pages by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from rsproto import ErrorCode, Limits

from ...policy import Policy
from ..ground.errors import CoreError
from ..ground.pages import PagedIndex
from ..ground.tenants import MAX_TENANT_BYTES
from ..ground.validate import opt_bool, opt_number, opt_text, req_text
from ..run.scope import Scope
from .tables import Tables

__all__ = ["admin_scope", "admin_tenant", "page_of"]

_MAX_CURSOR: Final = 2**62


def admin_tenant(tables: Tables, conn: int, args: dict[str, Any], what: str) -> str:
    """Admin only; the tenant named (an admin may name any), else the caller's."""
    tables.tenants.require_admin(conn, what)
    tenant = opt_text(args, "tenant", MAX_TENANT_BYTES)
    return tenant if tenant is not None else tables.tenant_of(conn)


def admin_scope(tables: Tables, tenant: str, args: dict[str, Any]) -> Scope:
    """The run ``args`` names (``scope``), ``tenant``'s: NOT_FOUND if it has none."""
    scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
    scope = tables.find_scope(tenant, scope_id)
    if scope is None:
        raise CoreError(ErrorCode.NOT_FOUND, f"no run {scope_id!r}")
    return scope


def page_of(
    pages: PagedIndex[Any] | None, args: dict[str, Any],
    match: Callable[[Any], bool] | None = None, weight: Callable[[Any], int] | None = None,
) -> tuple[list[Any], int | None]:
    """One page of ``pages`` as ``args`` asks (``cursor``, ``limit``, ``newest_first``),
    and the cursor to go on from (None: the walk is complete). ``weight``: the bytes an
    object adds to the reply; a page holds no more than ``Policy.PAGE_PAYLOAD_BYTES``."""
    cursor = int(opt_number(args, "cursor", 0, 0, _MAX_CURSOR))
    limit = int(opt_number(args, "limit", Policy.ADMIN_PAGE_DEFAULT, 1, Policy.ADMIN_PAGE_MAX))
    newest_first = opt_bool(args, "newest_first", False)
    if pages is None:
        return [], None
    return pages.page(cursor, limit, limit * Policy.ADMIN_SCAN_FACTOR, match, newest_first,
                      weight, Policy.PAGE_PAYLOAD_BYTES)
