"""Mailbox definitions: a named queue's mode and retry policy, shared by every run of
one tenant. Definitions are keyed ``(tenant, name)``: two tenants' mailboxes of one name
are two mailboxes, and neither can see or change the other's settings.

``ensure`` is declarative: it creates the mailbox or brings its settings to the given
values; the settings apply to deliveries from then on. A mailbox must be ensured before
any run uses it (NOT_FOUND otherwise), so a typo in a name fails loudly instead of
creating a queue nobody consumes. Ensuring with the settings it already has writes no
record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsproto import Limits, Op

from ..ground.pages import PagedIndex
from ..ground.validate import int_arg, invalid, req_text
from ..records import MailboxEnsured, Rec
from ..state.tables import Applier, Handler, Tables
from ..tenant.mailbox import MODES, Mailbox
from .pauses import Pauses

if TYPE_CHECKING:
    from .workbook import Work

__all__ = ["MailboxBook"]


def _always(box: Mailbox) -> bool:
    return True


class MailboxBook:
    """The MAILBOX_ENSURE op and its record, and the pauses' (pauses.py). Owned by the
    Core."""

    def __init__(self, tables: Tables, work: Work) -> None:
        self.tables = tables
        self.mailboxes = work.mailboxes
        # tenant -> its mailboxes, in the order they were defined (ADMIN_MAILBOXES,
        # admin.py); a definition is never removed
        self.pages: dict[str, PagedIndex[Mailbox]] = {}
        self.pauses = Pauses(tables, work)
        self.ops: dict[int, Handler] = {Op.MAILBOX_ENSURE: self.ensure, **self.pauses.ops}
        self.appliers: dict[int, Applier] = {
            Rec.MAILBOX_ENSURED: self.apply_ensured, **self.pauses.appliers,
        }

    def ensure(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        name = req_text(args, "name", Limits.MAX_MAILBOX_NAME_BYTES)
        mode = args.get("mode")
        if mode is None:
            mode = "WORK"
        if mode not in MODES:
            raise invalid(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        max_attempts = int_arg(
            args, "max_attempts", 1, Limits.MAX_ATTEMPTS, Limits.DEFAULT_MAX_ATTEMPTS
        )
        backoff = int_arg(
            args, "retry_backoff_ms", 0, Limits.MAX_RETRY_BACKOFF_MS,
            Limits.DEFAULT_RETRY_BACKOFF_MS,
        )
        tenant = self.tables.tenant_of(conn)
        existing = self.mailboxes.get((tenant, name))
        created = existing is None
        if created:
            self.tables.tenants.room(tenant, "mailboxes")
        if existing is None or (
            existing.mode, existing.max_attempts, existing.retry_backoff_ms
        ) != (mode, max_attempts, backoff):
            self.tables.commit(
                MailboxEnsured(Rec.MAILBOX_ENSURED, name, mode, max_attempts, backoff, tenant), now
            )
        return {**self.mailboxes[(tenant, name)].view(), "created": created}

    def apply_ensured(self, rec: MailboxEnsured, now: float) -> None:
        _, name, mode, max_attempts, backoff, tenant = rec
        tenants = self.tables.tenants
        tenant = tenants.name(tenant)
        existing = self.mailboxes.get((tenant, name))
        if existing is None:
            tenants.of_tenant(tenant).mailboxes += 1
            box = self.mailboxes[(tenant, name)] = Mailbox(
                tenant, name, mode, max_attempts, backoff
            )
            pages = self.pages.get(tenant)
            if pages is None:
                pages = self.pages[tenant] = PagedIndex(_always)
            pages.add(box)
        else:  # changed in place: its queues' depth and its live fairness keys are kept
            existing.mode, existing.max_attempts = mode, max_attempts
            existing.retry_backoff_ms = backoff
