"""Journal record types: every state change the core makes is one of these.

A record is a tuple whose first element is its type. Live operation and recovery go
through the same ``apply`` path (``Tables.commit`` appends a record and applies it), so
replaying the journal rebuilds the same state.
Records carry everything needed to apply them without looking at the request that
caused them, and applying one twice is harmless (a grant for a lease id that is already
known, or an end for a lease that is gone, changes nothing).

The layouts below are those of file format version 4 (version 3's and SNAP_QUEUED): a
record that makes or names a run, mailbox or item carries its tenant (last), and leases
are named by their handle (leases.py). Records of older files are brought to these
layouts by upgrade.py.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Rec"]


class Rec(IntEnum):
    # (SCOPE_CREATED, scope_id, wall_time, tenant)
    SCOPE_CREATED = 1
    # (CLAIM_GRANTED, scope_id, key, handle, generation, holder, lease_seconds, tenant)
    CLAIM_GRANTED = 2
    # (LEASE_ENDED, handle, reason)  reason: "released" | "expired"
    LEASE_ENDED = 3
    # (LEASE_RESIZED, handle, lease_seconds)  a renewal that changed the lease length
    LEASE_RESIZED = 4
    # (SCOPE_CANCELLED, scope_id, reason, wall_time, tenant)  what it ends follows as own
    #  records
    SCOPE_CANCELLED = 5
    # (MAILBOX_ENSURED, name, mode, max_attempts, retry_backoff_ms, tenant)
    MAILBOX_ENSURED = 10
    # (ITEM_ENQUEUED, item_id, is_message, scope_id, mailbox, key_or_work_key, digest,
    #  data, created_wall, deadline_wall, tenant)
    ITEM_ENQUEUED = 11
    # (DELIVERED, item_id, handle, attempt, holder, lease_seconds)
    DELIVERED = 12
    # (REQUEUED, item_id, handle, event, visible_at_wall, reason[, settled_wall])  event:
    #  retry | release | lease_expired; ends the delivery under that lease; settled_wall
    #  (retry and release: when its own settlement was made) is remembered (settled.py)
    REQUEUED = 13
    # (FINISHED, item_id, state, outcome, reason, finished_wall, dead_lettered[,
    #  settled_by])  settled_by: "complete" | "retry" | "reject" when the item's own
    #  delivery settled it (its lease is remembered: settled.py); absent otherwise
    FINISHED = 14
    # (SUBSCRIBED, item_id, subscriber_id, subscriber_scope)
    SUBSCRIBED = 15
    # (DETACHED, item_id, subscriber_id)
    DETACHED = 16
    # (TOMBSTONED, item_id)  retention passed: outcome and data dropped
    TOMBSTONED = 17
    # (DEDUPE_EXPIRED, scope_id, mailbox, work_key, item_id, tenant)
    DEDUPE_EXPIRED = 18
    # (FORGOTTEN, item_id)  the tombstone window passed: the task is gone for good
    FORGOTTEN = 19
    # (IDS_RESERVED, lease_ceiling, item_ceiling)  ids below the ceilings may be in use;
    #  made durable before any of them is shown to a client, whatever the fsync policy
    IDS_RESERVED = 30
    # (IDS_JUMPED, generation_delta)  after an unclean stop: counters jump to their
    #  ceilings and every generation by delta, so nothing a lost record gave out repeats
    IDS_JUMPED = 31
    # (CLEAN_SHUTDOWN, wall_time)  the last record of a journal that was closed properly
    CLEAN_SHUTDOWN = 32

    # (POOL_ENSURED, tenant, name, size)  a pool made, or resized (never revokes a slot)
    POOL_ENSURED = 60
    # (POOL_GRANTED, tenant, name, lease_id, generation, holder, scope_id, lease_seconds)
    #  also the snapshot record of a held slot
    POOL_GRANTED = 61
    # (POOL_ENDED, lease_id, reason)  reason: "released" | "expired"
    POOL_ENDED = 62
    # (QUOTA_ENSURED, tenant, name, limit, per_seconds, level, level_wall)  made or
    #  changed; also the snapshot record of a quota (its whole state)
    QUOTA_ENSURED = 63
    # (QUOTA_TAKEN, tenant, name, level, level_wall)  the level left right after a take
    QUOTA_TAKEN = 64
    # (SNAP_POOL, tenant, name, size, generation)
    SNAP_POOL = 65
    # (SNAP_POOL_SLOT, tenant, name, lease_id, generation, holder, scope_id, lease_seconds)
    SNAP_POOL_SLOT = 66
    # (ITEM_ENQUEUED_NEEDS, <the fields of ITEM_ENQUEUED>, pools, quotas)  an item that
    #  needs capacity to start: pools a sorted array of names, quotas a sorted array of
    #  [name, amount] (needs.py)
    ITEM_ENQUEUED_NEEDS = 67
    # (SNAP_ITEM_NEEDS, item_id, pools, quotas)  right after its item's SNAP_ITEM
    SNAP_ITEM_NEEDS = 68

    # (GROUP_JOINED, item_id, group)  a task joins a group of its run, right after its
    #  ITEM_ENQUEUED; also the snapshot record of a member (after the SNAP_ITEMs)
    GROUP_JOINED = 70

    # (DEAD_LETTER_REQUEUED, scope_id, mailbox, dead_item_id, new_item_id, tenant)  a dead
    #  letter taken off its list; the ITEM_ENQUEUED of its new item comes right before
    DEAD_LETTER_REQUEUED = 75

    # Snapshot records: each carries one object's whole state.
    # (SNAP_COUNTERS, next_lease, next_item, lease_ceiling, item_ceiling, generation_floor)
    #  next_lease, next_item: where a counter not in SNAP_ID_COUNTERS starts (ids.py)
    SNAP_COUNTERS = 40
    # (SNAP_ID_COUNTERS, {tenant: next lease id}, {item namespace: next number})  right
    #  after SNAP_COUNTERS: each tenant's counters (ids.py)
    SNAP_ID_COUNTERS = 49
    # (SNAP_SCOPE, scope_id, created_at, cancelled_reason, tenant[, quiet_since])
    #  quiet_since: the wall instant of its last RUN_QUIET (runends.py), None if none;
    #  absent in files written before runs were freed
    SNAP_SCOPE = 41
    # (SNAP_CLAIM, scope_id, key, generation, handle | None, holder, lease_seconds, tenant)
    SNAP_CLAIM = 42
    # (SNAP_ITEM, ...) one item's whole state: its layout is written once, in items.py,
    #  beside Item (item_record / item_from_record)
    SNAP_ITEM = 43
    # (SNAP_DEDUPE, scope_id, mailbox, work_key, item_id, digest, until, tenant)
    SNAP_DEDUPE = 44
    # (SNAP_DEAD_LETTER, scope_id, mailbox, entry, tenant)
    SNAP_DEAD_LETTER = 45
    # (SNAPSHOT_END, record_count)  the last record of a complete snapshot file
    SNAPSHOT_END = 46
    # (SNAP_QUEUED, tenant, scope_id, mailbox, rows)  up to 16 items waiting in one ready
    #  line with nothing else to them (format version 4): layout in items.py
    SNAP_QUEUED = 47
    # (SNAP_SETTLED, tenant, rows)  recent settlements remembered to answer a repeat:
    #  rows flat, [handle, kind, item_id, state, visible_at_wall | None, lease_seconds,
    #  handle, ...] (settled.py)
    SNAP_SETTLED = 48

    # (RUN_QUIET, scope_id, since_wall, tenant)  a run holds nothing: its quiet window
    #  began at since_wall (runends.py); at most one a second per run
    RUN_QUIET = 80
    # (RUN_FREED, scope_id, tenant)  a run that held nothing for its quiet window is
    #  gone (runends.py): naming it is NOT_FOUND, SCOPE_CREATE with its id makes it anew
    RUN_FREED = 81
