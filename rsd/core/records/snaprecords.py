"""Snapshot records, declared as records.py declares every kind: each carries one
object's whole state, and a snapshot file is a run of them ended by SNAPSHOT_END.

What always holds: the same as records.py's (one declaration a kind, fields only
appended, a later field with its version and a default or an older value).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from .declaration import declared, old_delivery
from .kinds import _BOUND, _HANDLE, _TENANT, _TENANT_OLDER, Rec

__all__ = [
    "RunsDropped", "RunsImported", "SnapClaim", "SnapCounters", "SnapDeadLetter", "SnapDedupe",
    "SnapForwarded", "SnapGrant", "SnapIdCounters", "SnapItem", "SnapItemNeeds", "SnapQueued",
    "SnapSchedule", "SnapScope", "SnapSettled", "SnapSignals", "SnapTaskEvents",
    "SnapshotEnd",
]


@declared(Rec.SNAP_COUNTERS, fields={"jumped_to": 9})
class SnapCounters(NamedTuple):
    """next_lease, next_item: where a counter not in SNAP_ID_COUNTERS starts (ids.py);
    jumped_to: the last jump's floor, which no grant goes below (0: none, or a file
    before version 9, whose held keys' generations were moved up to it instead)."""

    kind: Literal[Rec.SNAP_COUNTERS]
    next_lease: int
    next_item: int
    lease_ceiling: int
    item_ceiling: int
    generation_floor: int
    jumped_to: int = 0


@declared(Rec.SNAP_ID_COUNTERS, since=4)
class SnapIdCounters(NamedTuple):
    """Right after SNAP_COUNTERS: each tenant's counters (ids.py)."""

    kind: Literal[Rec.SNAP_ID_COUNTERS]
    leases: dict[str, int]  # tenant -> next lease id
    items: dict[str, int]  # item namespace -> next number


@declared(Rec.SNAP_SCOPE, fields={"tenant": 3, "quiet_since": 4}, older=_TENANT_OLDER)
class SnapScope(NamedTuple):
    """quiet_since: the wall instant of its last RUN_QUIET (runends.py), None if none."""

    kind: Literal[Rec.SNAP_SCOPE]
    scope_id: str
    created_at: float | None
    cancelled_reason: str | None
    tenant: str
    quiet_since: float | None = None


@declared(Rec.SNAP_CLAIM, fields={**_TENANT, _BOUND: 7}, changed=_HANDLE,
          older=_TENANT_OLDER)
class SnapClaim(NamedTuple):
    kind: Literal[Rec.SNAP_CLAIM]
    scope_id: str
    key: str
    generation: int
    handle: bytes | None
    holder: str | None
    lease_seconds: float | None
    tenant: str
    release_on_disconnect: bool = False  # CLAIM_GRANTED's


@declared(Rec.SNAP_ITEM, fields={"tenant": 3, "pools": 5, "quotas": 5, "not_before": 7,
                                "priority": 7, "fairness_key": 7, "awaiting_due": 7,
                                _BOUND: 7, "trace": 13},
          changed={"delivery": (3, old_delivery)}, older=_TENANT_OLDER)
class SnapItem(NamedTuple):
    """One item's whole state (items.py: item_record / item_from_record). pools,
    quotas: its needs, as ITEM_ENQUEUED's (a SNAP_ITEM_NEEDS record followed it before
    version 5). not_before, priority, fairness_key: as ITEM_ENQUEUED's (a DELAYED
    item's due instant is its visible_at_wall). awaiting_due: PENDING in a retry's
    backoff, which ends by an ITEM_DUE record (items.py). release_on_disconnect: its
    running delivery ends with its connection."""

    kind: Literal[Rec.SNAP_ITEM]
    item_id: str
    is_message: bool
    scope_id: str
    mailbox: str
    key: str | None
    digest: bytes | None
    data: Any
    created_wall: float
    deadline_wall: float | None
    state: str
    attempt: int
    outcome: Any
    reason: str | None
    finished_wall: float | None
    tombstoned: bool
    dead: bool
    visible_at_wall: float
    subscribers: dict[str, str | None]
    delivery: Any  # [lease handle, holder, lease seconds] | None
    tenant: str
    pools: list[str] | None = None
    quotas: list[list[Any]] | None = None
    not_before: float | None = None
    priority: int = 0
    fairness_key: str | None = None
    awaiting_due: bool = False
    release_on_disconnect: bool = False  # its delivery's, as DELIVERED's
    trace: dict[str, str] | None = None  # as ITEM_ENQUEUED's


@declared(Rec.SNAP_DEDUPE, fields=_TENANT, older=_TENANT_OLDER)
class SnapDedupe(NamedTuple):
    kind: Literal[Rec.SNAP_DEDUPE]
    scope_id: str
    mailbox: str
    work_key: str
    item_id: str
    digest: bytes
    until_wall: float
    tenant: str


@declared(Rec.SNAP_DEAD_LETTER, fields=_TENANT, older=_TENANT_OLDER)
class SnapDeadLetter(NamedTuple):
    kind: Literal[Rec.SNAP_DEAD_LETTER]
    scope_id: str
    mailbox: str
    entry: dict[str, Any]  # the dead letter (workbook.py)
    tenant: str


@declared(Rec.SNAPSHOT_END)
class SnapshotEnd(NamedTuple):
    """The last record of a complete snapshot file."""

    kind: Literal[Rec.SNAPSHOT_END]
    record_count: int


@declared(Rec.SNAP_QUEUED, since=4, fields={"priority": 7, "fairness_key": 7})
class SnapQueued(NamedTuple):
    """Up to 16 items waiting in one ready line with nothing else to them: rows flat,
    ``QueuedRow``'s fields one item after another (items.py); all of one priority and
    one fairness key (their lane: lanes.py)."""

    kind: Literal[Rec.SNAP_QUEUED]
    tenant: str
    scope_id: str
    mailbox: str
    rows: list[Any]
    priority: int = 0
    fairness_key: str | None = None


@declared(Rec.SNAP_SETTLED, since=4)
class SnapSettled(NamedTuple):
    """Recent settlements remembered to answer a repeat: rows flat, [handle, kind,
    item_id, state, visible_at_wall | None, lease_seconds, handle, ...] (settled.py)."""

    kind: Literal[Rec.SNAP_SETTLED]
    tenant: str
    rows: list[Any]


@declared(Rec.SNAP_ITEM_NEEDS, since=3)
class SnapItemNeeds(NamedTuple):
    """Right after its item's SNAP_ITEM in files before version 5 (their needs are
    SNAP_ITEM's fields since): read, no longer written."""

    kind: Literal[Rec.SNAP_ITEM_NEEDS]
    item_id: str
    pools: list[str]
    quotas: list[list[Any]]


@declared(Rec.SNAP_SCHEDULE, since=7)
class SnapSchedule(NamedTuple):
    """A schedule's whole state (schedulebook.py): SCHEDULE_ENSURED's fields, then
    whether it is paused, how many fires it recorded and the last one's time."""

    kind: Literal[Rec.SNAP_SCHEDULE]
    tenant: str
    scope_id: str
    name: str
    mailbox: str
    every_seconds: int | None
    cron: str | None
    timezone: str
    catch_up: str
    data: Any
    data_size: int
    next_wall: float
    created_wall: float
    paused: bool
    fired: int
    last_wall: float | None


@declared(Rec.RUNS_IMPORTED, since=10)
class RunsImported(NamedTuple):
    """Runs moved in from another shard with their slots (transfer.py), as one record so
    that a crash keeps all of them or none: ``records``, the snapshot records of exactly
    those runs' state (from the source's ``Transfer.export``), applied in order; and
    what the target must respect from then on: every generation above
    ``generation_floor`` (the source's), every lease id of a tenant in ``leases`` at or
    above its number there (the source's next). The item ids the records hold are taken
    from their namespaces' counters as they are applied."""

    kind: Literal[Rec.RUNS_IMPORTED]
    generation_floor: int
    leases: dict[str, int]  # tenant -> the source's next lease id
    records: list[Any]


@declared(Rec.RUNS_DROPPED, since=10)
class RunsDropped(NamedTuple):
    """Runs this shard gave away with their slots (transfer.py): everything of them
    leaves the core at once, nothing of it recorded one by one, nothing granted to
    anyone by it (their waits were answered MOVED before, live). ``runs``: [tenant,
    run id] each."""

    kind: Literal[Rec.RUNS_DROPPED]
    runs: list[Any]


@declared(Rec.SNAP_FORWARDED, since=10)
class SnapForwarded(NamedTuple):
    """Leases this shard gave away with their runs, still answered MOVED
    (ground/forwarded.py): rows flat, [handle, lease_seconds, tenant, run id, handle,
    ...]; each kept its length again from the restore, as a restored lease is."""

    kind: Literal[Rec.SNAP_FORWARDED]
    rows: list[Any]


@declared(Rec.SNAP_GRANT, since=11)
class SnapGrant(NamedTuple):
    """An item's grants from another shard (work/grants.py), after its SNAP_ITEM: the
    last grant's ``seq``, and the grant it holds now (``handle`` None: none)."""

    kind: Literal[Rec.SNAP_GRANT]
    item_id: str
    seq: int
    handle: bytes | None
    lease_seconds: float


@declared(Rec.SNAP_TASK_EVENTS, since=13)
class SnapTaskEvents(NamedTuple):
    """Right after its task's SNAP_ITEM: the task's retained events (work/progress.py),
    oldest first, each a map as the wire shows it; ``next_seq`` the seq its next event
    takes."""

    kind: Literal[Rec.SNAP_TASK_EVENTS]
    item_id: str
    next_seq: int
    events: list[Any]  # maps, as the wire shows them


@declared(Rec.SNAP_SIGNALS, since=13)
class SnapSignals(NamedTuple):
    """Right after its item's SNAP_ITEM: a task's signals (run/signals.py). sent,
    waits: the signals sent to it and its suspends so far; name: the signal it waits
    for while WAITING (its timeout is the item's visible_at), else None; woken: [name,
    data] of the signal that ended its last wait, else None; kept: the signals kept for
    it, oldest first, each [name, data]."""

    kind: Literal[Rec.SNAP_SIGNALS]
    item_id: str
    sent: int
    waits: int
    name: str | None
    woken: list[Any] | None
    kept: list[list[Any]]
