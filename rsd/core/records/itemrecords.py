"""The records of tasks and messages, declared as records.py declares every kind: an
item made, delivered, requeued, finished, subscribed to, tombstoned and forgotten, and
the rows of SNAP_QUEUED (``QueuedRow``); a dead letter requeued or deleted.

What always holds: the same as records.py's (one declaration a kind, fields only
appended, a later field with its version and a default or an older value).
"""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple, TypeVar

from .declaration import ALIASES, declared
from .kinds import _BOUND, _HANDLE, _TENANT, _TENANT_OLDER, Rec

__all__ = [
    "DeadLetterDeleted", "DeadLetterRequeued", "DebounceKeyed", "Delivered", "Detached",
    "Finished", "Forgotten", "GrantEnded", "GrantHeld", "GroupJoined", "ItemDebounced",
    "ItemDue", "ItemEnqueued", "QueuedRow", "Requeued", "Signalled", "SnapLinks", "Subscribed",
    "Suspended", "TaskFollowed", "TaskProgressed", "TaskUnblocked", "Tombstoned",
    "WaitTimedOut", "built", "enqueued",
]


@declared(Rec.ITEM_ENQUEUED, fields={"tenant": 3, "pools": 5, "quotas": 5, "data_size": 5,
                                    "not_before": 7, "priority": 7, "fairness_key": 7,
                                    "trace": 13, "parents": 14, "on_parent_failure": 14,
                                    "parent": 14},
          older=_TENANT_OLDER)
class ItemEnqueued(NamedTuple):
    """A task or message made. pools, quotas: its needs (needs.py), a sorted array of
    pool names and one of [quota name, amount]; None for an item that needs nothing.
    data_size: the stored size of data as its handler measured it (payloads.py), -1
    when not recorded (older files, a dead letter enqueued again): measured when
    applied. not_before: the wall instant before which it is not delivered (it is
    DELAYED until then), None for an item ready at once; priority: 0 to 9, higher
    delivered first; fairness_key: its share of the queue (lanes.py), None for none.
    trace: the W3C trace context its submitter gave (``{"traceparent": ...}`` and
    ``"tracestate"`` if any: ground/traces.py), handed back with each delivery; None
    for none. parents, on_parent_failure, parent: a task's links (work/parents.py), all
    None for a task submitted without ``after`` or ``parent`` (and a message); else
    ``parents`` its ``after`` (task ids of its run, at most 64, each once: [] for a
    child with no ``after``), on_parent_failure "cancel" or "run", ``parent`` the task
    it is a child of or None. Its applier takes them before the task is placed: BLOCKED
    while a parent has not ended. (Before version 14 nothing had links.)"""

    kind: Literal[Rec.ITEM_ENQUEUED]
    item_id: str
    is_message: bool
    scope_id: str
    mailbox: str
    key: str | None  # the task key, or the message's work_key
    digest: bytes | None
    data: Any
    created_wall: float
    deadline_wall: float | None
    tenant: str
    pools: list[str] | None = None
    quotas: list[list[Any]] | None = None
    data_size: int = -1
    not_before: float | None = None
    priority: int = 0
    fairness_key: str | None = None
    trace: dict[str, str] | None = None
    parents: list[str] | None = None
    on_parent_failure: str | None = None
    parent: str | None = None


ALIASES[Rec.ITEM_ENQUEUED_NEEDS] = (Rec.ITEM_ENQUEUED, 5)  # its fields: version 5's


_Record = TypeVar("_Record", bound=tuple[Any, ...])
_tuple_new: Final = tuple.__new__


def built(kind: type[_Record], fields: tuple[Any, ...]) -> _Record:
    """``kind(*fields)``, for ``fields`` every field of the record kind ``kind``, in
    order: the tuple made straight, without the Python-level ``__new__`` a NamedTuple's
    call runs (a frame of the interpreter, about 2,600 instructions a record in the
    compiled core). The records a task's every cycle writes (ITEM_ENQUEUED, DELIVERED,
    FINISHED) are built so; ``fields`` is not checked against the declaration here
    (mypy cannot), so each caller gives them all, as the round-trip tests check."""
    return _tuple_new(kind, fields)


def enqueued(
    *, item_id: str, is_message: bool, scope_id: str, mailbox: str, key: str | None,
    digest: bytes | None, data: Any, created_wall: float, deadline_wall: float | None,
    tenant: str, pools: list[str] | None = None, quotas: list[list[Any]] | None = None,
    data_size: int = -1, not_before: float | None = None, priority: int = 0,
    fairness_key: str | None = None, trace: dict[str, str] | None = None,
    parents: list[str] | None = None, on_parent_failure: str | None = None,
    parent: str | None = None,
) -> ItemEnqueued:
    """The one place an ITEM_ENQUEUED is built (a submit, a send, a dead letter enqueued
    again, a schedule's fire): every field named, and what a path leaves out (no needs,
    size unmeasured, ready at once, priority 0, no fairness key, no trace, no links)
    defaulted here, as the record's own defaults (the test of an item's order holds them
    equal)."""
    return built(ItemEnqueued, (
        Rec.ITEM_ENQUEUED, item_id, is_message, scope_id, mailbox, key, digest, data,
        created_wall, deadline_wall, tenant, pools, quotas, data_size, not_before, priority,
        fairness_key, trace, parents, on_parent_failure, parent,
    ))


@declared(Rec.ITEM_DUE, since=7)
class ItemDue(NamedTuple):
    """A DELAYED item's not_before came: it is PENDING, in its ready line."""

    kind: Literal[Rec.ITEM_DUE]
    item_id: str


@declared(Rec.DEBOUNCE_KEYED, since=13)
class DebounceKeyed(NamedTuple):
    """A message sent with a debounce key, right after its ITEM_ENQUEUED (DELAYED, its
    not_before the end of its window): it holds that key in its queue until it is
    delivered or ends (work/debounce.py); also the snapshot record of such a message
    (after the SNAP_ITEMs)."""

    kind: Literal[Rec.DEBOUNCE_KEYED]
    item_id: str
    debounce_key: str


@declared(Rec.ITEM_DEBOUNCED, since=13)
class ItemDebounced(NamedTuple):
    """A send with the debounce key of a message still undelivered replaced its data
    (``data_size``: its stored size, as its handler measured it) and moved its due
    instant to ``due_wall`` (the message is DELAYED until then: work/debounce.py)."""

    kind: Literal[Rec.ITEM_DEBOUNCED]
    item_id: str
    data: Any
    data_size: int
    due_wall: float


@declared(Rec.SNAP_LINKS, since=14)
class SnapLinks(NamedTuple):
    """A task's links in a snapshot, after every SNAP_ITEM (its parents are then
    known): its ITEM_ENQUEUED's links fields."""

    kind: Literal[Rec.SNAP_LINKS]
    item_id: str
    parents: list[str]
    on_parent_failure: str
    parent: str | None


@declared(Rec.TASK_UNBLOCKED, since=14)
class TaskUnblocked(NamedTuple):
    """Every parent of each of these BLOCKED tasks has ended and they may run (one
    record for all that one end lets go): each PENDING, or DELAYED until its
    not_before if that is after ``at_wall`` (the wall instant of the decision)."""

    kind: Literal[Rec.TASK_UNBLOCKED]
    item_ids: list[str]
    at_wall: float


@declared(Rec.DELIVERED, changed=_HANDLE, fields={_BOUND: 7})
class Delivered(NamedTuple):
    """release_on_disconnect: as CLAIM_GRANTED's (records.py)."""

    kind: Literal[Rec.DELIVERED]
    item_id: str
    handle: bytes
    attempt: int
    holder: str
    lease_seconds: float
    release_on_disconnect: bool = False


@declared(Rec.REQUEUED, changed=_HANDLE, fields={"settled_wall": 4})
class Requeued(NamedTuple):
    """Ends the delivery under that lease. event: retry | release | lease_expired;
    settled_wall (retry and release: when its own settlement was made) is remembered
    (settled.py)."""

    kind: Literal[Rec.REQUEUED]
    item_id: str
    handle: bytes
    event: str
    visible_at_wall: float
    reason: str | None
    settled_wall: float | None = None


@declared(Rec.FINISHED, fields={"settled_by": 4, "outcome_size": 5})
class Finished(NamedTuple):
    """settled_by: "complete" | "retry" | "reject" when the item's own delivery settled
    it (its lease is remembered: settled.py); None otherwise. outcome_size: the stored
    size of outcome as its handler measured it, -1 when not recorded (measured when
    applied)."""

    kind: Literal[Rec.FINISHED]
    item_id: str
    state: str
    outcome: Any
    reason: str | None
    finished_wall: float
    dead_lettered: bool
    settled_by: str | None = None
    outcome_size: int = -1


@declared(Rec.SUBSCRIBED)
class Subscribed(NamedTuple):
    kind: Literal[Rec.SUBSCRIBED]
    item_id: str
    subscriber_id: str
    subscriber_scope: str | None


@declared(Rec.DETACHED)
class Detached(NamedTuple):
    kind: Literal[Rec.DETACHED]
    item_id: str
    subscriber_id: str


@declared(Rec.TOMBSTONED)
class Tombstoned(NamedTuple):
    """Retention passed: outcome and data dropped."""

    kind: Literal[Rec.TOMBSTONED]
    item_id: str


@declared(Rec.DEDUPE_EXPIRED, fields=_TENANT, older=_TENANT_OLDER)
class DedupeExpired(NamedTuple):
    kind: Literal[Rec.DEDUPE_EXPIRED]
    scope_id: str
    mailbox: str
    work_key: str
    item_id: str
    tenant: str


@declared(Rec.FORGOTTEN)
class Forgotten(NamedTuple):
    """The tombstone window passed: the task is gone for good."""

    kind: Literal[Rec.FORGOTTEN]
    item_id: str


@declared(Rec.GROUP_JOINED, since=3)
class GroupJoined(NamedTuple):
    """A task joins a group of its run, right after its ITEM_ENQUEUED; also the
    snapshot record of a member (after the SNAP_ITEMs)."""

    kind: Literal[Rec.GROUP_JOINED]
    item_id: str
    group: str


@declared(Rec.DEAD_LETTER_REQUEUED, since=3)
class DeadLetterRequeued(NamedTuple):
    """A dead letter taken off its list; the ITEM_ENQUEUED of its new item comes right
    before."""

    kind: Literal[Rec.DEAD_LETTER_REQUEUED]
    scope_id: str
    mailbox: str
    dead_item_id: str
    new_item_id: str
    tenant: str


@declared(Rec.DEAD_LETTER_DELETED, since=8)
class DeadLetterDeleted(NamedTuple):
    """A dead letter taken off its list for good (DEAD_LETTER_DELETE: deadletters.py)."""

    kind: Literal[Rec.DEAD_LETTER_DELETED]
    scope_id: str
    mailbox: str
    dead_item_id: str
    tenant: str


class QueuedRow(NamedTuple):
    """One item of a SNAP_QUEUED record's rows (flat: QUEUED_FIELDS values an item, in
    this order; every other field of its SNAP_ITEM is its default: items.py)."""

    item_id: str
    is_message: bool
    key: str | None
    digest: bytes | None
    data: Any
    created_wall: float
    deadline_wall: float | None
    attempt: int
    reason: str | None
    visible_at_wall: float


@declared(Rec.GRANT_HELD, since=11)
class GrantHeld(NamedTuple):
    """The shard of an item's pools and quotas granted them for its next delivery
    (work/grants.py): grant ``seq`` of the item (asked under the hold key its shell made
    of this shard, the item id and ``seq``), a lease of that shard (``handle``, renewed
    every so often for ``lease_seconds``). Held until the delivery it starts ends, or
    GRANT_ENDED."""

    kind: Literal[Rec.GRANT_HELD]
    item_id: str
    seq: int
    handle: bytes
    lease_seconds: float


@declared(Rec.GRANT_ENDED, since=11)
class GrantEnded(NamedTuple):
    """An item's grant ``seq`` ended before a delivery used it, or was never had: the
    next ask is ``seq`` + 1. reason: "lapsed" (on its shard) | "abandoned" (its shard
    had the ask already and no grant came: one lost in a takeover)."""

    kind: Literal[Rec.GRANT_ENDED]
    item_id: str
    seq: int
    reason: str


@declared(Rec.TASK_PROGRESSED, since=13)
class TaskProgressed(NamedTuple):
    """The worker holding a task's delivery published a progress event (``data``, of
    ``size`` stored bytes as its handler measured it) at the wall instant
    ``wall_time``: kept among the task's retained events (work/progress.py), the
    oldest dropped past the bounds."""

    kind: Literal[Rec.TASK_PROGRESSED]
    item_id: str
    data: Any
    wall_time: float
    size: int


@declared(Rec.TASK_FOLLOWED, since=13)
class TaskFollowed(NamedTuple):
    """A live task with no retained events got its first follower (TASK_EVENTS): from
    now on it keeps its events as one that published progress does, the first saying
    where it is (work/progress.py). At most one a task: its log exists after it."""

    kind: Literal[Rec.TASK_FOLLOWED]
    item_id: str


@declared(Rec.SUSPENDED, since=13)
class Suspended(NamedTuple):
    """Ends the delivery under that lease without using an attempt: the task is WAITING
    for a signal ``name`` until the wall instant ``until_wall`` (its timeout), or, if a
    signal of that name was kept for it, woken by the oldest such at once (PENDING).
    settled_wall: when its worker's settlement was made (remembered: settled.py)."""

    kind: Literal[Rec.SUSPENDED]
    item_id: str
    handle: bytes
    name: str
    until_wall: float
    settled_wall: float


@declared(Rec.SIGNALLED, since=13)
class Signalled(NamedTuple):
    """A signal ``name`` with ``data`` sent to a task: it wakes the task if the task
    waits for that name (PENDING, the signal carried by its next deliveries), else it is
    kept for a later wait. seq: the task's signals so far, this one counted (applied
    once: a replay over a state that has it changes nothing). data_size: the stored
    size of data as its handler measured it, -1 when not recorded (measured when
    applied)."""

    kind: Literal[Rec.SIGNALLED]
    item_id: str
    seq: int
    name: str
    data: Any
    data_size: int = -1


@declared(Rec.WAIT_TIMED_OUT, since=13)
class WaitTimedOut(NamedTuple):
    """A WAITING task's timeout came before a signal: PENDING, with no signal. wait:
    which of its waits (its suspends so far, that one counted), so that a replay never
    ends a later one."""

    kind: Literal[Rec.WAIT_TIMED_OUT]
    item_id: str
    wait: int
