"""Work items: shared tasks and plain messages, the one table of their states, and the
one layout of their snapshot record.

Everything that changes an item's state goes through ``transition``: a move that is
not in ``TRANSITIONS`` is a bug in rsd, never a client's doing, and raises. protocol.md
prints the same table and a test checks that they agree. Events are ``Event`` members;
a record that carries one (REQUEUED) carries its plain string value.

A task lives in its scope under its key (when it has one) and is read by id; a message
is a task without a result: nobody waits for it, and it is forgotten once consumed,
except for its ``work_key`` dedupe entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, final

from ..ground.leases import Lease
from ..records import Rec
from ..records.itemrecords import QueuedRow
from ..records.snaprecords import SnapItem, SnapQueued
from ..tenant.needs import Needs

if TYPE_CHECKING:
    from .links import Links  # (links.py imports this module)

__all__ = [
    "QUEUED_FIELDS",
    "QUEUED_PER_RECORD",
    "STATE_BY_NAME",
    "TERMINAL",
    "TRANSITIONS",
    "Event",
    "Item",
    "State",
    "gathered",
    "item_from_record",
    "item_record",
    "plainly_queued",
    "queued_items",
    "queued_record",
    "transition",
]


class State(StrEnum):
    DELAYED = "DELAYED"  # submitted or sent with a not_before still ahead: not delivered
    PENDING = "PENDING"  # queued (or waiting out a retry backoff) for a worker
    RUNNING = "RUNNING"  # delivered to a worker under a live lease
    # suspended by its worker until a signal of the name it waits for, or its timeout
    # (work/waiting.py): no lease, no worker, not delivered; then PENDING again
    WAITING = "WAITING"
    # submitted ``after`` parents of which one has not ended yet (work/parents.py): not
    # delivered; then PENDING (or DELAYED, its delay still ahead), or CANCELLED
    BLOCKED = "BLOCKED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"


class Event(StrEnum):
    """What happens to an item. The values are protocol.md's names for them."""

    DELIVER = "deliver"
    COMPLETE = "complete"
    RETRY = "retry"
    RELEASE = "release"
    LEASE_EXPIRED = "lease_expired"
    REJECT = "reject"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    CANCEL = "cancel"
    DEADLINE = "deadline"
    DUE = "due"
    SUSPEND = "suspend"
    SIGNAL = "signal"
    WAIT_TIMEOUT = "wait_timeout"
    DEBOUNCE = "debounce"
    PARENTS_MET = "parents_met"
    PARENTS_MET_EARLY = "parents_met_early"


STATE_BY_NAME: Final = {state.value: state for state in State}
_NAME: Final = {state: state.value for state in State}  # a dict lookup: cheaper than ``.value``
NO_SUBSCRIBERS: Final[Mapping[str, str | None]] = MappingProxyType({})

TERMINAL: Final = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED})

# (state, event) -> next state. The only legal moves.
TRANSITIONS: Final[dict[tuple[State, Event], State]] = {
    (State.DELAYED, Event.DUE): State.PENDING,
    (State.DELAYED, Event.CANCEL): State.CANCELLED,
    (State.DELAYED, Event.DEADLINE): State.EXPIRED,
    (State.PENDING, Event.DELIVER): State.RUNNING,
    # a message due but never delivered, sent again with its debounce key (debounce.py)
    (State.PENDING, Event.DEBOUNCE): State.DELAYED,
    (State.RUNNING, Event.COMPLETE): State.SUCCEEDED,
    (State.RUNNING, Event.RETRY): State.PENDING,
    (State.RUNNING, Event.RELEASE): State.PENDING,
    (State.RUNNING, Event.LEASE_EXPIRED): State.PENDING,
    (State.RUNNING, Event.REJECT): State.FAILED,
    (State.RUNNING, Event.ATTEMPTS_EXHAUSTED): State.FAILED,
    (State.PENDING, Event.CANCEL): State.CANCELLED,
    (State.RUNNING, Event.CANCEL): State.CANCELLED,
    (State.PENDING, Event.DEADLINE): State.EXPIRED,
    (State.RUNNING, Event.DEADLINE): State.EXPIRED,
    (State.RUNNING, Event.SUSPEND): State.WAITING,
    (State.WAITING, Event.SIGNAL): State.PENDING,
    (State.WAITING, Event.WAIT_TIMEOUT): State.PENDING,
    (State.WAITING, Event.CANCEL): State.CANCELLED,
    (State.WAITING, Event.DEADLINE): State.EXPIRED,
    # a task submitted ``after`` parents (work/parents.py): every parent ended, and its
    # delay, if any, has passed (met) or is still ahead (met early)
    (State.BLOCKED, Event.PARENTS_MET): State.PENDING,
    (State.BLOCKED, Event.PARENTS_MET_EARLY): State.DELAYED,
    (State.BLOCKED, Event.CANCEL): State.CANCELLED,
    (State.BLOCKED, Event.DEADLINE): State.EXPIRED,
}


def transition(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise AssertionError(f"illegal task transition: {event} in {state}") from None


@final  # no kind of item but this one: ``type(x) is Item`` tells it from anything else
class Item:
    """A task or a message. ``key`` is the task key or the message's work_key."""

    __slots__ = (
        "attempt", "awaiting_due", "blocked_on", "created_at", "data", "dead", "deadline",
        "debounce_key", "delivery", "digest", "events", "fairness_key", "finished_at", "group",
        "id", "is_message", "key", "limits", "links", "mailbox", "needs", "not_before",
        "outcome", "priority", "queued", "reason", "run", "scope", "signals", "size", "state",
        "subscribers", "tenant", "tombstoned", "trace", "visible_at", "watchers",
    )

    def __init__(
        self,
        tenant: str,
        item_id: str,
        is_message: bool,
        scope: str,
        mailbox: str,
        key: str | None,
        digest: bytes | None,
        data: Any,
        created_at: float,
        deadline: float | None,
        not_before: float | None,
        priority: int,
        fairness_key: str | None,
    ) -> None:
        """Every item is built here, from whichever record (ITEM_ENQUEUED, SNAP_ITEM, a
        SNAP_QUEUED row), its order (itemorder.py) given, never set afterwards. Made with
        a ``not_before``, it is DELAYED until then (a snapshot's item then takes the
        state and visible_at its record says)."""
        self.tenant = tenant  # its scope's tenant
        self.id = item_id
        self.is_message = is_message
        self.scope = scope
        self.mailbox = mailbox
        self.key = key
        self.digest = digest
        self.data = data
        self.created_at = created_at  # wall clock
        self.deadline = deadline  # wall clock, or None
        self.attempt = 0  # deliveries so far; the next delivery is attempt + 1
        self.outcome: Any = None
        self.size = 0  # payload bytes its tenant is charged for it: data + outcome (workbook.py)
        self.reason: str | None = None
        self.finished_at: float | None = None
        self.tombstoned = self.dead = False
        self.trace: dict[str, str] | None = None  # its submitter's W3C trace context
        self.delivery: Lease | None = None
        self.queued = False  # sitting in its queue's ready line
        self.not_before = not_before  # wall clock: the delay it was made with
        # ``visible_at``: the wall clock before which it is not delivered (backoff, delay...)
        if not_before is None:
            self.state, self.visible_at = State.PENDING, 0.0
        else:  # DELAYED from the start, until ITEM_DUE
            self.state, self.visible_at = State.DELAYED, not_before
        self.awaiting_due = False  # in a retry's backoff: ready again by ITEM_DUE alone
        self.priority = priority  # 0 to 9, higher delivered first (lanes.py)
        self.fairness_key = fairness_key  # its lane within its priority (lanes.py)
        # Most items never have either: share empty ones, made real on first use.
        self.subscribers: Mapping[str, str | None] = NO_SUBSCRIBERS  # id -> its scope
        self.watchers: Any = ()  # result waits: (), the one ResultWait, or a WaitLine
        self.needs: Any = None  # a needs.Needs: the capacity each delivery takes, or None
        self.blocked_on: Any = None  # the Pool or Quota whose line it waits in (blocked.py)
        self.group: Any = None  # the Group it belongs to (groupbook.py), if any
        self.run: Any = None  # the Scope that counts it (tally.py); tasks only
        self.signals: Any = None  # a task's signals, run/signals.py (the wait, those kept)
        self.events: Any = None  # its events (eventlog.py), from its first progress or follower
        self.debounce_key: str | None = None  # held in its queue's ``debounced`` (debounce.py)
        self.links: Any = None  # a links.Links: its parents and children (work/parents.py)
        self.limits: Any = None  # a task's keylimits.ItemKeys: its concurrency and rate keys

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def view(self) -> dict[str, Any]:
        """The task as TASK_STATUS shows it; ``group`` only for a member of one."""
        view = {
            "id": self.id,
            "scope": self.scope,
            "mailbox": self.mailbox,
            "key": self.key,
            "state": _NAME[self.state],
            "attempt": self.attempt,
            "outcome": self.outcome,
            "reason": self.reason,
            "tombstoned": self.tombstoned,
            "subscribers": sorted(self.subscribers),
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "deadline": self.deadline,
            "not_before": self.not_before,
            "priority": self.priority,
            "fairness_key": self.fairness_key,
        }
        if self.needs is not None:  # only items submitted with needs show them
            view["needs"] = self.needs.view()
            view["waiting_for"] = self._waiting_for()
        if self.group is not None:
            view["group"] = self.group.name
        links: Links | None = self.links  # (typed: compiled, called in place, not by name)
        if links is not None:  # only a task with parents or children
            links.add_view(view)
        if self.limits is not None:  # only a task submitted with key limits (keylimits.py)
            view["limits"] = self.limits.view()
            held = self.blocked_on
            view["held_by"] = held.held_view() if hasattr(held, "held_view") else None
        if self.signals is not None:  # only a task that waited or was signalled
            view["signals"] = self.signals.view(
                self.visible_at if self.state is State.WAITING else None
            )
        return view

    def outcome_view(self) -> dict[str, Any]:
        """The task as a result wait with ``outcome_only`` is answered: what a waiter for
        its outcome reads (``id``, ``state``, ``outcome``, ``reason``) and nothing else,
        so there are fewer keys to build and encode; ``tombstoned`` only once it is (its
        outcome then reads nil though it had one)."""
        view = {
            "id": self.id, "state": _NAME[self.state], "outcome": self.outcome,
            "reason": self.reason,
        }
        if self.tombstoned:
            view["tombstoned"] = True
        return view

    def _waiting_for(self) -> dict[str, Any] | None:
        """The pool or quota this pending item was found lacking and waits for; None when
        it is not blocked (it needs nothing, is not pending, or was not yet tried)."""
        resource = self.blocked_on
        if resource is None or hasattr(resource, "held_view"):  # (held by a key: not needs)
            return None
        if not hasattr(resource, "name"):  # a grant of another shard's (grants.py): all
            return self.needs.view()  # type: ignore[no-any-return]
        if hasattr(resource, "per_seconds"):  # a quota
            return {"pools": [], "quotas": {resource.name: dict(self.needs.quotas)[resource.name]}}
        return {"pools": [resource.name], "quotas": {}}


# ---- the snapshot record ------------------------------------------------------------
# An item's whole state as one SNAP_ITEM record (its layout declared in snaprecords.py),
# built here once and read here once (core/restore.py unpacks it for its fast path).
# Files before format version 3 had no tenant and a lease id for the handle: upgrade.py
# brings them to the declared layout.


def item_record(item: Item, bound: bool = False) -> SnapItem:
    """``bound``: its delivery's lease ends with its connection (leases.py)."""
    lease = item.delivery
    pools, quotas = (None, None) if item.needs is None else item.needs.as_record()
    return SnapItem(
        Rec.SNAP_ITEM, item.id, item.is_message, item.scope, item.mailbox, item.key,
        item.digest, item.data, item.created_at, item.deadline, item.state.value,
        item.attempt, item.outcome, item.reason, item.finished_at, item.tombstoned,
        item.dead, item.visible_at, dict(item.subscribers),
        None if lease is None else (lease.handle, lease.holder, lease.length),
        item.tenant, pools, quotas, item.not_before, item.priority, item.fairness_key,
        item.awaiting_due, bound, item.trace,
    )


def item_from_record(rec: SnapItem) -> tuple[Item, tuple[Any, ...] | None]:
    """The item a SNAP_ITEM record describes, and its delivery (lease handle, holder,
    lease seconds, whether it ends with its connection) if it was running: the caller
    owns the lease table."""
    (_, item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline,
     state, attempt, outcome, reason, finished_at, tombstoned, dead, visible_at,
     subscribers, delivery, tenant, pools, quotas, not_before, priority, fairness_key,
     awaiting_due, bound, trace) = rec
    item = Item(
        tenant, item_id, is_message, scope_id, mailbox, key, digest, data, created, deadline,
        not_before, priority, fairness_key,
    )
    item.state = STATE_BY_NAME[state]
    item.attempt = attempt
    item.outcome = outcome
    item.reason = reason
    item.finished_at = finished_at
    item.tombstoned = tombstoned
    item.dead = dead
    item.visible_at = visible_at
    item.awaiting_due = awaiting_due
    item.trace = trace
    if subscribers:
        item.subscribers = dict(subscribers)
    if pools is not None and quotas is not None:
        item.needs = Needs.from_record(pools, quotas)
    return item, None if delivery is None else (*delivery, bound)


# ---- the compact record of queued items -----------------------------------------------
# Most of a big snapshot is items waiting in a ready line with nothing else to them
# (``plainly_queued``). Those of one queue go, in line order, up to QUEUED_PER_RECORD at
# a time, into one SNAP_QUEUED record (file format version 4): their own fields
# (``QueuedRow``, declared in records.py) one item after another in one flat list,
# every other field its default (PENDING, no outcome, ending, subscriber, delivery,
# needs or trace). It decodes in well under half the time of as many SNAP_ITEMs.
# ``queued_items`` gives the SNAP_ITEM records it stands for; core/restore.py reads the
# rows in place (the fast path of recovery), unpacking each as a QueuedRow.

QUEUED_FIELDS: Final = len(QueuedRow._fields)  # fields per item in a SNAP_QUEUED record's rows
# Even with every payload (256 KiB) and key (512 bytes) at its limit, 16 items encode in
# about 4 MiB: half the largest frame a file may hold (logfile.MAX_RECORD_BYTES).
QUEUED_PER_RECORD: Final = 16


def plainly_queued(item: Item) -> bool:
    """Whether ``item`` waits in its ready line with nothing else to it: what a
    SNAP_QUEUED record can hold."""
    return (
        item.queued and item.state is State.PENDING and item.delivery is None
        and not item.subscribers and item.outcome is None and item.finished_at is None
        and not item.tombstoned and not item.dead and item.needs is None
        and item.not_before is None and item.signals is None and item.events is None
        and item.trace is None and item.limits is None
    )


def gathered(line: Iterable[Item]) -> Iterator[Item | list[Item]]:
    """``line`` (queued items in line order, queue after queue) with the plainly queued
    ones gathered into lists, each of at most QUEUED_PER_RECORD items of one queue: a
    list is written as one SNAP_QUEUED record, a lone item as its own records."""
    plain: list[Item] = []
    for item in line:
        is_plain = plainly_queued(item)
        if plain and (
            not is_plain or len(plain) == QUEUED_PER_RECORD
            or item.mailbox != plain[0].mailbox or item.scope != plain[0].scope
            or item.tenant != plain[0].tenant or item.priority != plain[0].priority
            or item.fairness_key != plain[0].fairness_key
        ):
            yield plain
            plain = []
        if is_plain:
            plain.append(item)
        else:
            yield item
    if plain:
        yield plain


def queued_record(items: list[Item]) -> SnapQueued:
    """The SNAP_QUEUED record of ``items``: plainly queued, in line order, all of one
    queue, at most QUEUED_PER_RECORD."""
    first = items[0]
    rows: list[Any] = []
    for item in items:
        rows += QueuedRow(
            item.id, item.is_message, item.key, item.digest, item.data, item.created_at,
            item.deadline, item.attempt, item.reason, item.visible_at,
        )
    return SnapQueued(
        Rec.SNAP_QUEUED, first.tenant, first.scope, first.mailbox, rows, first.priority,
        first.fairness_key,
    )


def queued_items(rec: Sequence[Any]) -> list[SnapItem]:
    """The SNAP_ITEM records a SNAP_QUEUED record (a list, as read from a file) stands
    for, in order."""
    _, tenant, scope_id, mailbox, rows, priority, fairness_key = rec
    out: list[SnapItem] = []
    for at in range(0, len(rows) - QUEUED_FIELDS + 1, QUEUED_FIELDS):
        row = QueuedRow._make(rows[at : at + QUEUED_FIELDS])
        out.append(SnapItem(
            Rec.SNAP_ITEM, row.item_id, row.is_message, scope_id, mailbox, row.key,
            row.digest, row.data, row.created_wall, row.deadline_wall, _NAME[State.PENDING],
            row.attempt, None, row.reason, None, False, False, row.visible_at_wall, {}, None,
            tenant, None, None, None, priority, fairness_key,
        ))
    return out
