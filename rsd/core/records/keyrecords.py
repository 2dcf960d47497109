"""The records of limits by key (work/keylimits.py), declared as records.py declares
every kind: a task's keys and the limits its submit stated, a rate key's period begun,
and the snapshot record of one key's state.

What always holds: the same as records.py's (one declaration a kind, fields only
appended, a later field with its version and a default or an older value).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from .declaration import declared
from .kinds import Rec

__all__ = ["ItemLimited", "RatePeriodBegun", "SnapKeyGate"]


@declared(Rec.ITEM_LIMITED, since=14)
class ItemLimited(NamedTuple):
    """A task submitted with a concurrency key or a rate key (or both), right after its
    ITEM_ENQUEUED: it carries them, and each key's limit becomes the one stated here
    (the newest submit's); also the snapshot record of such a task (after its
    SNAP_ITEM). A key not given is None, and so are its limits."""

    kind: Literal[Rec.ITEM_LIMITED]
    item_id: str
    concurrency_key: str | None
    concurrency_limit: int | None
    rate_key: str | None
    rate_limit: int | None
    rate_period_seconds: float | None


@declared(Rec.RATE_PERIOD_BEGUN, since=14)
class RatePeriodBegun(NamedTuple):
    """A delivery of a task with rate key ``key`` (in ``mailbox`` of run ``scope_id``)
    began a new period at ``start_wall``, right before its DELIVERED: the deliveries that
    follow count in this period until ``start_wall`` + the key's period."""

    kind: Literal[Rec.RATE_PERIOD_BEGUN]
    tenant: str
    scope_id: str
    mailbox: str
    key: str
    start_wall: float


@declared(Rec.SNAP_KEY_GATE, since=14)
class SnapKeyGate(NamedTuple):
    """One key's state in a snapshot, after the ITEM_LIMITED records of the tasks that
    carry it: ``kind`` 0 concurrency (``limit``), 1 rate (``limit`` per ``period``, the
    current period's ``start_wall`` and its ``deliveries``). A concurrency
    key's running count is not kept: its running tasks say it."""

    kind: Literal[Rec.SNAP_KEY_GATE]
    tenant: str
    scope_id: str
    mailbox: str
    gate_kind: int
    key: str
    limit: int
    period_seconds: float
    start_wall: float
    deliveries: int
