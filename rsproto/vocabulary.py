"""The protocol's vocabulary: frame kinds, op codes, push events and error codes.

Numbers and names here are the wire contract, stable forever: a new op or event takes a
new number, a new error a new name. ``protocol.md`` states the same tables in prose and
``tests/test_protocol_doc.py`` checks that the two agree.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = ["ERROR", "PROTOCOL_VERSION", "PUSH", "REPLY", "REQUEST", "ErrorCode", "Kind", "Op",
           "Push"]

PROTOCOL_VERSION = 1


class Kind(IntEnum):
    """First element of every frame body."""

    REQUEST = 1  # [1, request_id, op, args]
    REPLY = 2  # [2, request_id, result]
    ERROR = 3  # [3, request_id, code, message, details]; request_id 0 = connection error
    PUSH = 4  # [4, event, body]


# The same numbers as plain ints, for hot paths where enum attribute access costs more
# than the packing itself.
REQUEST, REPLY, ERROR, PUSH = (int(kind) for kind in Kind)


class Op(IntEnum):
    """Request op codes. Numbers are stable forever; new ops take new numbers."""

    HELLO = 1
    PING = 2
    CANCEL = 3
    SERVER_STATS = 4
    SLOT_MAP = 5  # the cluster's slot map: which shard owns which slots, and its primary
    SCOPE_CREATE = 10
    SCOPE_CANCEL = 11
    SCOPE_STATUS = 12
    CLAIM_ACQUIRE = 20
    LEASE_RENEW = 21
    CLAIM_RELEASE = 22
    CLAIM_INSPECT = 23
    FENCE_CHECK = 24
    MAILBOX_ENSURE = 30
    TASK_SUBMIT = 31
    MESSAGE_SEND = 32
    RECEIVE = 33
    DELIVERY_COMPLETE = 34
    DELIVERY_RETRY = 35
    DELIVERY_RELEASE = 36
    DELIVERY_REJECT = 37
    DEAD_LETTERS = 38
    QUEUE_INSPECT = 39
    TASK_STATUS = 40
    TASK_RESULT = 41
    TASK_JOIN = 42
    TASK_DETACH = 43
    TASK_CANCEL = 44
    TASK_SUBMIT_MANY = 45
    GROUP_WAIT = 46
    GROUP_STATUS = 47
    MAILBOX_PAUSE = 48  # a mailbox paused or resumed in every run of the tenant
    QUEUE_PAUSE = 49  # a mailbox paused or resumed in one run
    POOL_ENSURE = 50
    POOL_ACQUIRE = 51
    POOL_RELEASE = 52
    POOL_INSPECT = 53
    QUOTA_ENSURE = 55
    QUOTA_TAKE = 56
    QUOTA_INSPECT = 57
    SCHEDULE_ENSURE = 60
    SCHEDULE_LIST = 61
    SCHEDULE_GET = 62
    SCHEDULE_PAUSE = 63
    SCHEDULE_RESUME = 64
    SCHEDULE_DELETE = 65
    DELIVERY_PROGRESS = 66  # a worker publishes a progress event on the task it holds
    TASK_EVENTS = 67  # subscribe to a task's events: retained ones, then pushes
    DELIVERY_SUSPEND = 68  # settle a delivery into WAITING without spending an attempt
    TASK_SIGNAL = 69  # signal a task by id: wakes it if it waits for that name
    TASK_CHILDREN = 70  # the children of a task (submitted with ``parent``)
    # Admin ops (rsctl): listings are paged, scoped to the caller's tenant unless an
    # admin names another.
    ADMIN_SCOPES = 80
    ADMIN_CLAIMS = 81
    ADMIN_TASKS = 82
    ADMIN_TASK = 83
    ADMIN_POOLS = 84
    DEAD_LETTER_REQUEUE = 85
    SNAPSHOT_NOW = 86
    ADMIN_DEAD_LETTERS = 87
    DEAD_LETTER_DELETE = 88
    ADMIN_GROUPS = 89
    # Replication, from a standby to its primary (a feed: after a HELLO with
    # ``replicate``): not answered.
    REPL_ACK = 90
    # More admin ops (80-89 are taken): the dashboard's listings.
    ADMIN_QUOTAS = 100
    ADMIN_MAILBOXES = 101
    ADMIN_QUEUES = 102
    SLOTS_MOVE = 103  # admin: hand slots of this shard to another (rsctl slots move)
    SLOTS_IMPORT = 104  # admin: a moving range's runs, sent by the source shard's primary
    BACKUP_BEGIN = 105  # admin: pin the latest snapshot and the journal after it (backups.py)
    BACKUP_READ = 106  # admin: a chunk of a pinned file
    BACKUP_END = 107  # admin: unpin (also when the connection closes)


class Push(IntEnum):
    """Server-initiated events, sent as PUSH frames."""

    LEASE_LOST = 1
    # Replication, from a primary to a standby that follows it (feeds.py).
    REPL_COPY = 2
    REPL_BATCH = 3
    TASK_EVENTS = 4  # events of a task a connection subscribed to (TASK_EVENTS)


class ErrorCode(StrEnum):
    """The closed set of error codes. On the wire an error carries the name as a string."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    CLAIM_HELD = "CLAIM_HELD"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    STALE_CLAIM = "STALE_CLAIM"
    WAIT_TIMEOUT = "WAIT_TIMEOUT"
    CANCELLED = "CANCELLED"
    SCOPE_CANCELLED = "SCOPE_CANCELLED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    POOL_FULL = "POOL_FULL"
    QUOTA_EXHAUSTED = "QUOTA_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    NOT_PRIMARY = "NOT_PRIMARY"
    MOVED = "MOVED"  # the run's slot belongs to another shard: not executed, go there
    UNKNOWN_OP = "UNKNOWN_OP"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    INTERNAL = "INTERNAL"
