"""Journal record kinds, each declared once, by name: every state change the core makes
is one of these.

A record is a ``typing.NamedTuple`` whose first field is its kind (``Rec``); msgpack
writes it as an array, so a record's layout on disk is its declaration's field order.
Live operation and recovery go through the same ``apply`` path (``Tables.commit``
appends a record and applies it), so replaying the journal rebuilds the same state.
Records carry everything needed to apply them without looking at the request that
caused them, and applying one twice is harmless (a grant for a lease id that is already
known, or an end for a lease that is gone, changes nothing).

What always holds:
- each kind has one declaration (``@declared``), here, in itemrecords.py (tasks and
  messages) or in snaprecords.py (snapshots): its fields with their types, and
  a default for an optional field (an optional field is a field with a default, never
  a new kind); the appliers (typed by it: mypy checks every unpacking), the journal
  codec and snapshots (``read``), the upgrade of older files (upgrade.py),
  core/restore.py and ``rsctl journal dump`` (``fields_of``) all read it;
- each declaration says the file format version in which its kind appeared
  (``since``), in which each later field appeared (``fields``) and, for a field whose
  form changed, the version of today's form and how the older form is brought to it
  (``changed``); a field absent from an older file takes its default, or its ``older``
  value;
- fields are only ever appended (a new field has a default, or a new version): so a
  record of any version is its declaration's fields in order, cut short at most;
- a record is built positionally on hot paths (by keyword costs more), and those a
  task's every cycle writes with ``built`` (itemrecords.py: the tuple made straight, not
  through the NamedTuple's Python-level ``__new__``); what recovery reads is a list of
  exactly the declared fields (``read`` brings every other record to that: defaults
  filled, old kinds renamed), which appliers unpack by position, as the NamedTuple
  itself unpacks: an applier never reads a record's field by name.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from .declaration import (
    ALIASES,
    DECLARED,
    declared,
    fields_of,
    old_delivery,
    old_handle,
    read,
)
from .kinds import _BOUND, _HANDLE, _TENANT, _TENANT_OLDER, Rec

__all__ = [
    "ALIASES", "DECLARED", "FORMAT_VERSION", "Rec", "declared", "fields_of",
    "old_delivery", "old_handle", "read",
]

FORMAT_VERSION = 14  # the file format version rsd writes (logfile.py): today's layouts

# ---- the declarations (items: itemrecords.py; snapshots: snaprecords.py) -------------
# Version 1: the first files; 2: frames salted (records as in 1); 3: every object
# carries its tenant, leases are named by handle (16 bytes; 8 for one of an old file);
# 4: SNAP_QUEUED, then per-tenant counters, runs freed, settlements remembered (fields
# and kinds with defaults, read by version 4 files that lack them); 5: ITEM_ENQUEUED
# carries the item's needs (ITEM_ENQUEUED_NEEDS before); 6: STREAM_AT (a cluster node's
# place in its primary's stream); 7: grants (of claims, slots and deliveries) and their
# snapshot records say whether the lease ends with its connection
# (``release_on_disconnect``, False before); delayed items, priorities and fairness keys
# (ITEM_DUE, the new item fields); schedules (SCHEDULE_ENSURED .. SNAP_SCHEDULE);
# 8: DEAD_LETTER_DELETED (an operator deleted a dead letter); 9: SNAP_COUNTERS carries
# the last jump's generation floor (a key held through a jump keeps its holder's);
# 10: RUNS_IMPORTED, RUNS_DROPPED (runs moved to another shard with their slots:
# transfer.py), SNAP_FORWARDED (the leases that left with them: forwarded.py); 11:
# GRANT_HELD, GRANT_ENDED, SNAP_GRANT (capacity a task holds from another shard:
# work/grants.py); 12: MAILBOX_PAUSED (a mailbox paused or resumed, for every run of
# its tenant or in one run: work/pauses.py); 13: TASK_PROGRESSED, TASK_FOLLOWED,
# SNAP_TASK_EVENTS (a task's retained events: work/progress.py), SUSPENDED, SIGNALLED,
# WAIT_TIMED_OUT, SNAP_SIGNALS (a task that waits for a signal without holding a
# worker: work/waiting.py), DEBOUNCE_KEYED,
# ITEM_DEBOUNCED (a message held by its debounce key, and its replacement:
# work/debounce.py); 14: ITEM_ENQUEUED's links (parents, on_parent_failure, parent),
# SNAP_LINKS, TASK_UNBLOCKED (a task's parents and children, and a BLOCKED task let go:
# work/parents.py), ITEM_LIMITED,
# RATE_PERIOD_BEGUN, SNAP_KEY_GATE (a task's concurrency and rate keys, a rate key's
# period, a key's state: work/keylimits.py).


@declared(Rec.SCOPE_CREATED, fields=_TENANT, older=_TENANT_OLDER)
class ScopeCreated(NamedTuple):
    kind: Literal[Rec.SCOPE_CREATED]
    scope_id: str
    wall_time: float
    tenant: str


@declared(Rec.CLAIM_GRANTED, fields={**_TENANT, _BOUND: 7}, changed=_HANDLE,
          older=_TENANT_OLDER)
class ClaimGranted(NamedTuple):
    """release_on_disconnect: the lease ends when the connection it was granted on
    closes, and with every connection at a restart or a takeover (leases.py)."""

    kind: Literal[Rec.CLAIM_GRANTED]
    scope_id: str
    key: str
    handle: bytes
    generation: int
    holder: str
    lease_seconds: float
    tenant: str
    release_on_disconnect: bool = False


@declared(Rec.LEASE_ENDED, changed=_HANDLE)
class LeaseEnded(NamedTuple):
    kind: Literal[Rec.LEASE_ENDED]
    handle: bytes
    reason: str  # "released" | "expired" | "scope cancelled" ...


@declared(Rec.LEASE_RESIZED, changed=_HANDLE)
class LeaseResized(NamedTuple):
    """A renewal that changed the lease length."""

    kind: Literal[Rec.LEASE_RESIZED]
    handle: bytes
    lease_seconds: float


@declared(Rec.SCOPE_CANCELLED, fields=_TENANT, older=_TENANT_OLDER)
class ScopeCancelled(NamedTuple):
    """What it ends follows as own records."""

    kind: Literal[Rec.SCOPE_CANCELLED]
    scope_id: str
    reason: str
    wall_time: float
    tenant: str


@declared(Rec.MAILBOX_ENSURED, fields=_TENANT, older=_TENANT_OLDER)
class MailboxEnsured(NamedTuple):
    kind: Literal[Rec.MAILBOX_ENSURED]
    name: str
    mode: str
    max_attempts: int
    retry_backoff_ms: int
    tenant: str


@declared(Rec.MAILBOX_PAUSED, since=12)
class MailboxPaused(NamedTuple):
    """A mailbox paused (``paused``) or resumed: for every run of its tenant
    (``scope_id`` None), or in the run ``scope_id`` alone. A paused queue takes items
    but delivers none (work/pauses.py)."""

    kind: Literal[Rec.MAILBOX_PAUSED]
    name: str
    tenant: str
    scope_id: str | None
    paused: bool


@declared(Rec.IDS_RESERVED)
class IdsReserved(NamedTuple):
    """Ids below the ceilings may be in use; made durable before any of them is shown
    to a client, whatever the fsync policy."""

    kind: Literal[Rec.IDS_RESERVED]
    lease_ceiling: int
    item_ceiling: int


@declared(Rec.IDS_JUMPED)
class IdsJumped(NamedTuple):
    """After an unclean stop: counters jump to their ceilings and every generation by
    delta, so nothing a lost record gave out repeats."""

    kind: Literal[Rec.IDS_JUMPED]
    generation_delta: int


@declared(Rec.CLEAN_SHUTDOWN)
class CleanShutdown(NamedTuple):
    """The last record of a journal that was closed properly."""

    kind: Literal[Rec.CLEAN_SHUTDOWN]
    wall_time: float


@declared(Rec.STREAM_AT, since=6)
class StreamAt(NamedTuple):
    """Where this state stands in a cluster (rsd/cluster/): it holds the journal of the
    primary of ``epoch`` up to batch ``batch`` (a standby: its copy and each batch it
    journals say so), or, ``led``, it is that primary's own (written when a node becomes
    the primary). After a restart the directory says so what its node may do: resume
    following from ``batch``, or lead again (node.py's ``may_lead``)."""

    kind: Literal[Rec.STREAM_AT]
    epoch: int
    batch: int
    led: bool


@declared(Rec.POOL_ENSURED, since=3)
class PoolEnsured(NamedTuple):
    """A pool made, or resized (never revokes a slot)."""

    kind: Literal[Rec.POOL_ENSURED]
    tenant: str
    name: str
    size: int


@declared(Rec.POOL_GRANTED, since=3, fields={_BOUND: 7})
class PoolGranted(NamedTuple):
    """release_on_disconnect: as CLAIM_GRANTED's."""

    kind: Literal[Rec.POOL_GRANTED]
    tenant: str
    name: str
    handle: bytes
    generation: int
    holder: str
    scope_id: str
    lease_seconds: float
    release_on_disconnect: bool = False


@declared(Rec.POOL_ENDED, since=3)
class PoolEnded(NamedTuple):
    kind: Literal[Rec.POOL_ENDED]
    handle: bytes
    reason: str  # "released" | "expired"


@declared(Rec.QUOTA_ENSURED, since=3)
class QuotaEnsured(NamedTuple):
    """Made or changed; also the snapshot record of a quota (its whole state)."""

    kind: Literal[Rec.QUOTA_ENSURED]
    tenant: str
    name: str
    limit: int
    per_seconds: float
    level: float
    level_wall: float


@declared(Rec.QUOTA_TAKEN, since=3)
class QuotaTaken(NamedTuple):
    """The level left right after a take."""

    kind: Literal[Rec.QUOTA_TAKEN]
    tenant: str
    name: str
    level: float
    level_wall: float


@declared(Rec.SNAP_POOL, since=3)
class SnapPool(NamedTuple):
    kind: Literal[Rec.SNAP_POOL]
    tenant: str
    name: str
    size: int
    generation: int


@declared(Rec.SNAP_POOL_SLOT, since=3, fields={_BOUND: 7})
class SnapPoolSlot(NamedTuple):
    kind: Literal[Rec.SNAP_POOL_SLOT]
    tenant: str
    name: str
    handle: bytes
    generation: int
    holder: str
    scope_id: str
    lease_seconds: float
    release_on_disconnect: bool = False


@declared(Rec.RUN_QUIET, since=4)
class RunQuiet(NamedTuple):
    """A run holds nothing: its quiet window began at since_wall (runends.py); at most
    one a second per run."""

    kind: Literal[Rec.RUN_QUIET]
    scope_id: str
    since_wall: float
    tenant: str


@declared(Rec.RUN_FREED, since=4)
class RunFreed(NamedTuple):
    """A run that held nothing for its quiet window is gone (runends.py): naming it is
    NOT_FOUND, SCOPE_CREATE with its id makes it anew."""

    kind: Literal[Rec.RUN_FREED]
    scope_id: str
    tenant: str


@declared(Rec.SCHEDULE_ENSURED, since=7)
class ScheduleEnsured(NamedTuple):
    """A schedule made, or changed (schedulebook.py): every_seconds or cron (one of the
    two) in timezone; data is each fire's task data, data_size its stored size;
    next_wall its next fire time. Keeps a paused schedule paused."""

    kind: Literal[Rec.SCHEDULE_ENSURED]
    tenant: str
    scope_id: str
    name: str
    mailbox: str
    every_seconds: int | None
    cron: str | None
    timezone: str
    catch_up: str  # "latest" | "all" | "none"
    data: Any
    data_size: int
    next_wall: float
    created_wall: float


@declared(Rec.SCHEDULE_FIRED, since=7)
class ScheduleFired(NamedTuple):
    """The fire times due at a tick were handled (their tasks' ITEM_ENQUEUED records
    precede it in the same batch): ``fired`` of them fired, the last at ``last_wall``
    (None: none fired, all missed and not caught up); the next fire time is
    ``next_wall``."""

    kind: Literal[Rec.SCHEDULE_FIRED]
    tenant: str
    scope_id: str
    name: str
    fired: int
    last_wall: float | None
    next_wall: float


@declared(Rec.SCHEDULE_PAUSED, since=7)
class SchedulePaused(NamedTuple):
    """Paused (``paused`` True) or resumed; ``next_wall``: its next fire time on resume
    (fire times passed while paused are not caught up)."""

    kind: Literal[Rec.SCHEDULE_PAUSED]
    tenant: str
    scope_id: str
    name: str
    paused: bool
    next_wall: float


@declared(Rec.SCHEDULE_DELETED, since=7)
class ScheduleDeleted(NamedTuple):
    kind: Literal[Rec.SCHEDULE_DELETED]
    tenant: str
    scope_id: str
    name: str
    reason: str  # "deleted" | "scope cancelled"


# The records of items and the snapshot records are declared beside: importing this
# module declares them too.
from . import itemrecords as _itemrecords  # noqa: E402
from . import keyrecords as _keyrecords  # noqa: E402
from . import snaprecords as _snaprecords  # noqa: E402

assert set(DECLARED) | set(ALIASES) == set(Rec), "every kind declared once"
assert _itemrecords and _snaprecords and _keyrecords
