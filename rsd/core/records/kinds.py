"""Record kinds (``Rec``), and the field maps many declarations share.

Apart from the declarations (``records/__init__.py``, ``itemrecords.py``,
``snaprecords.py``) so that each of them imports what it needs from below instead of
from the package that imports them all: no module of records/ reaches back up.
"""

from __future__ import annotations

from enum import IntEnum

from .declaration import old_handle

__all__ = ["DEFAULT_TENANT", "Rec"]

DEFAULT_TENANT = "default"  # tenants.py's: every object of a file before version 3 is its

class Rec(IntEnum):
    """Record kinds: the first field of every record (never reused)."""

    SCOPE_CREATED = 1
    CLAIM_GRANTED = 2
    LEASE_ENDED = 3
    LEASE_RESIZED = 4
    SCOPE_CANCELLED = 5
    MAILBOX_ENSURED = 10
    ITEM_ENQUEUED = 11
    DELIVERED = 12
    REQUEUED = 13
    FINISHED = 14
    SUBSCRIBED = 15
    DETACHED = 16
    TOMBSTONED = 17
    DEDUPE_EXPIRED = 18
    FORGOTTEN = 19
    MAILBOX_PAUSED = 20
    TASK_PROGRESSED = 21
    SNAP_TASK_EVENTS = 22
    # a task that waits for a signal (work/waiting.py)
    SUSPENDED = 23
    SIGNALLED = 24
    WAIT_TIMED_OUT = 25
    SNAP_SIGNALS = 26
    TASK_FOLLOWED = 27  # a task's first follower: it keeps its events from then on
    # a task's parents and children (work/parents.py): their snapshot record; a BLOCKED
    # task whose parents have all ended. (28 was TASK_LINKED, a task's links in a record
    # of their own before its ITEM_ENQUEUED, written by no released rsd: never reused.)
    SNAP_LINKS = 29
    IDS_RESERVED = 30
    IDS_JUMPED = 31
    CLEAN_SHUTDOWN = 32
    STREAM_AT = 33
    DEBOUNCE_KEYED = 34
    ITEM_DEBOUNCED = 35
    TASK_UNBLOCKED = 36
    # limits by key (work/keylimits.py)
    ITEM_LIMITED = 37
    RATE_PERIOD_BEGUN = 38
    SNAP_KEY_GATE = 39

    POOL_ENSURED = 60
    POOL_GRANTED = 61
    POOL_ENDED = 62
    QUOTA_ENSURED = 63
    QUOTA_TAKEN = 64
    SNAP_POOL = 65
    SNAP_POOL_SLOT = 66
    # ITEM_ENQUEUED with its needs, as files before version 5 wrote it: read as
    #  ITEM_ENQUEUED (``ALIASES``), never written; the number is never reused
    ITEM_ENQUEUED_NEEDS = 67
    SNAP_ITEM_NEEDS = 68

    GROUP_JOINED = 70

    DEAD_LETTER_REQUEUED = 75
    DEAD_LETTER_DELETED = 76

    SNAP_COUNTERS = 40
    SNAP_ID_COUNTERS = 49
    SNAP_SCOPE = 41
    SNAP_CLAIM = 42
    SNAP_ITEM = 43
    SNAP_DEDUPE = 44
    SNAP_DEAD_LETTER = 45
    SNAPSHOT_END = 46
    SNAP_QUEUED = 47
    SNAP_SETTLED = 48

    RUN_QUIET = 80
    RUN_FREED = 81
    ITEM_DUE = 84

    SCHEDULE_ENSURED = 90
    SCHEDULE_FIRED = 91
    SCHEDULE_PAUSED = 92
    SCHEDULE_DELETED = 93
    SNAP_SCHEDULE = 94

    RUNS_IMPORTED = 100
    RUNS_DROPPED = 101
    SNAP_FORWARDED = 102

    GRANT_HELD = 110
    GRANT_ENDED = 111
    SNAP_GRANT = 112


# The field maps many declarations share (see the format versions in __init__.py).
_TENANT = {"tenant": 3}
_TENANT_OLDER = {"tenant": DEFAULT_TENANT}
_HANDLE = {"handle": (3, old_handle)}
_BOUND = "release_on_disconnect"  # a lease that ends with its connection (leases.py)
