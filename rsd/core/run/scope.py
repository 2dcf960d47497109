"""A run (scope): the namespace every claim, task and queue lives in, and what it holds.

A ``Scope`` is keyed ``(tenant, scope id)`` (``ScopeKey``) in ``Tables.scopes``. What it
holds is kept here as the books change it, so reading a run never walks anything:
its claims, tasks by key, queues, live items, held slots, groups and parked waits; the
counts SCOPE_STATUS reports (``counts`` by state name, tally.py; ``held_claims``); its
admin indexes (pages.py: claims, items, queues, groups); and where it is on its way to
being freed once it holds nothing (``quiet``: ``IDLE``, ``QUEUED``, ``ARMED``;
runends.py). The rules that make, cancel and free runs are scopebook.py's and
runends.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from rsproto import ErrorCode

from ..ground.errors import CoreError
from ..ground.pages import PagedIndex

if TYPE_CHECKING:
    from ..ground.leases import Lease
    from ..ground.waits import Wait
    from .claim import Claim
    from .group import Group
    from .items import Item
    from .queue import Queue
    from .schedule import Schedule

__all__ = ["ARMED", "IDLE", "QUEUED", "Scope", "ScopeKey"]

ScopeKey = tuple[str, str]  # (tenant, scope id)

# Scope.quiet: where a run is on its way to being freed (runends.py).
IDLE: Final = 0  # holds something, or never seen empty
QUEUED: Final = 1  # found empty, waiting for ``RunEnds.arm`` to know ``now``
ARMED: Final = 2  # quiet since Scope.quiet_since (its last RUN_QUIET)


class Scope:
    __slots__ = (
        "cancelled", "claim_pages", "claims", "counts", "created_at", "group_pages", "groups",
        "held_claims", "id", "item_pages", "key", "lined", "live_items", "parked",
        "queue_pages", "queues", "quiet", "quiet_since", "schedule_pages", "schedules", "slots",
        "tasks", "tenant",
    )

    def __init__(self, tenant: str, scope_id: str, created_at: float | None) -> None:
        self.tenant = tenant
        self.id = scope_id
        self.key: ScopeKey = (tenant, scope_id)
        self.created_at = created_at  # wall clock of explicit creation, None if implicit
        self.cancelled: str | None = None  # the reason, once cancelled
        self.claims: dict[str, Claim] = {}
        self.tasks: dict[str, Item] = {}  # task key -> task
        self.queues: dict[str, Queue] = {}  # mailbox name -> this scope's queue
        self.live_items: dict[str, Item] = {}  # item id -> unfinished task or message
        # What SCOPE_STATUS reports, kept as it changes (never a walk): tasks known by
        # state name (tally.py), held claim leases, held pool slots (handle -> lease).
        self.counts: dict[str, int] = {}
        self.held_claims = 0
        self.slots: dict[bytes, Lease] = {}
        self.groups: dict[str, Group] = {}  # group name -> its members' counters
        self.schedules: dict[str, Schedule] = {}  # schedule name -> it (schedulebook.py)
        # Pool and quota waits parked for this run (waits.py keeps it exact), so that
        # cancelling the run finds them without a walk over every pool and quota.
        self.parked: dict[Wait, None] = {}
        # The admin listings' indexes (pages.py), made on first use.
        self.claim_pages: PagedIndex[Claim] | None = None
        self.item_pages: PagedIndex[Item] | None = None
        self.queue_pages: PagedIndex[Queue] | None = None
        self.group_pages: PagedIndex[Group] | None = None
        self.schedule_pages: PagedIndex[Schedule] | None = None  # (SCHEDULE_LIST's)
        # On its way to being freed once it holds nothing (runends.py): the state, and
        # the wall-clock instant of its last RUN_QUIET (None before the first).
        self.quiet = 0
        self.quiet_since: float | None = None
        self.lined = False  # its one entry is on RunEnds.line

    def holds_nothing(self) -> bool:
        """Whether the run holds no claim, queue, task (any the server still knows,
        keyed or not, finished and tombstoned too: ``counts``), live item, pool slot,
        parked wait, group or schedule: what may be freed without anyone noticing but by its id."""
        return not (
            self.claims or self.queues or self.counts or self.tasks or self.live_items
            or self.slots or self.parked or self.groups or self.schedules
        )

    def cancelled_message(self) -> str:
        return f"run {self.id!r} was cancelled: {self.cancelled}"

    def refuse_if_cancelled(self) -> None:
        """New work in a cancelled run is SCOPE_CANCELLED: the one place of that rule."""
        if self.cancelled is not None:
            raise CoreError(ErrorCode.SCOPE_CANCELLED, self.cancelled_message())
