"""Typed results: what the SDK's reads and waits return, as TypedDicts.

They are plain dicts at run time, so the guide's ``outcome["state"]`` keeps working,
while a type checker knows every field (the wire meaning of each is in protocol.md,
"Tasks, messages and deliveries").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

if TYPE_CHECKING:
    from .leases import Lease

__all__ = [
    "Acquired",
    "Busy",
    "ClaimView",
    "DeadLetter",
    "Needs",
    "QueueCounts",
    "SentMessage",
    "TaskOutcome",
    "TaskState",
    "TaskView",
    "TryAcquire",
]

TaskState = Literal[
    "DELAYED", "PENDING", "RUNNING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED",
    "BLOCKED",
]


class Needs(TypedDict, total=False):
    """What a task or message needs to start (``submit(..., needs=...)``): one slot of each
    pool named in ``pools`` and the amount of each quota in ``quotas``, all taken at once
    when it is delivered; the slots are held until the delivery settles or its lease ends,
    the quota is spent."""

    pools: list[str]
    quotas: dict[str, int]


class TaskView(TypedDict):
    """A task as the server sees it: ``submit``, ``status``, ``result``, ``join``,
    ``detach`` and ``cancel`` return it. ``outcome`` is set only once SUCCEEDED (and
    not after tombstoning); ``created`` only in submit's reply."""

    id: str
    scope: str
    mailbox: str
    key: str | None
    state: TaskState
    attempt: int
    outcome: Any
    reason: str | None
    tombstoned: bool
    subscribers: list[str]
    created_at: float
    finished_at: float | None
    deadline: float | None
    not_before: float | None  # while DELAYED (and after): when its delay runs out
    priority: int  # 0 to 9, higher delivered first
    fairness_key: str | None  # its fair share of the queue, within its priority
    created: NotRequired[bool]
    # Only for tasks submitted with needs: what they need, and while PENDING and found
    # without capacity, the pool or quota they wait for (else None).
    needs: NotRequired[Needs]
    waiting_for: NotRequired[Needs | None]
    group: NotRequired[str]  # only for a member of a task group
    # Only for a task that suspended or was signalled (delivery.suspend, ticket.signal):
    # {"waiting_for", "timeout_at", "kept", "woken_by"}; gone once it ends.
    signals: NotRequired[dict[str, Any]]
    # Only for a task submitted with ``after``: its parents' ids (each once, in order)
    # and what a parent's failure does ("cancel" or "run"); only for a child, its
    # parent's id; only for a task with children, how many (``ticket.children()``).
    after: NotRequired[list[str]]
    on_parent_failure: NotRequired[str]
    parent: NotRequired[str]
    children: NotRequired[int]
    # Only for a task submitted with limits by key: the keys and limits it was submitted
    # with, and while PENDING and held back by one, that key's state (protocol.md
    # "Limits by key": kind, key, limit, and running, or count and period_ends_at).
    limits: NotRequired[dict[str, Any]]
    held_by: NotRequired[dict[str, Any] | None]


class TaskOutcome(TypedDict):
    """What ``result(outcome_only=True)`` and ``submit_and_wait(..., outcome_only=True)``
    return: the task's outcome and how it ended, nothing else (a smaller reply for the
    server to build and send; ``status()`` reads the rest). The fields mean what
    ``TaskView``'s of those names mean; ``tombstoned`` is there (True) only once the
    task is tombstoned, its outcome then None whatever it was."""

    id: str
    state: TaskState
    outcome: Any
    reason: str | None
    tombstoned: NotRequired[bool]


class ClaimView(TypedDict):
    """``claim.inspect()``: a snapshot of the claim, maybe stale when it arrives."""

    held: bool
    generation: int
    holder: str | None
    waiters: int


class QueueCounts(TypedDict):
    """``mailbox.inspect()``: ready, running, delayed, waiting, parked consumers, dead
    letters kept, paused."""

    ready: int
    running: int
    delayed: int  # submitted or sent with a delay that has not yet run out
    waiting: int  # tasks suspended until a signal or their timeout (delivery.suspend)
    consumers: int
    dead_letters: int
    paused: bool  # delivers nothing: paused in this run or for every run
    blocked_by_parents: int  # BLOCKED tasks: submitted ``after`` tasks not all ended


class DeadLetter(TypedDict):
    """One entry of ``mailbox.dead_letters()``."""

    id: str
    kind: Literal["task", "message"]
    key: str | None
    data: Any
    attempt: int
    reason: str
    at: float


class SentMessage(TypedDict):
    """``mailbox.send()``: the message id, and whether it was a duplicate send; for a
    send with a ``debounce_key``, whether it replaced the waiting message's data."""

    id: str
    replay: bool
    replaced: NotRequired[bool]


class Busy(TypedDict):
    """``try_acquire()`` when someone else holds the key."""

    kind: Literal["busy"]
    holder: NotRequired[str | None]  # a claim's holder; a pool has many, so none


class Acquired(TypedDict):
    """``try_acquire()`` when the key was free: the lease is yours to release."""

    kind: Literal["acquired"]
    lease: Lease


TryAcquire = Busy | Acquired


class ChildView(TypedDict):
    """One entry of ``ticket.children()``: a task submitted with this one as ``parent``."""

    id: str
    key: str | None
    state: TaskState
