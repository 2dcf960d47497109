"""Scopes (runs): the namespace every claim, task and queue lives in.

A scope is known once it is created explicitly (SCOPE_CREATE, which makes a fresh id)
or first used by id: workers attach to a run whose id they were handed, and a key
inside one scope never collides with the same key inside another. A cancelled scope
refuses new work (SCOPE_CANCELLED) but still answers reads. The table is keyed by
``ScopeKey`` so a tenant can be added to the key without reshaping anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsproto import ErrorCode

from .errors import CoreError

if TYPE_CHECKING:
    from .claims import Claim
    from .queues import Queue
    from .tasks import Item

__all__ = ["Scope", "ScopeKey"]

ScopeKey = str


class Scope:
    __slots__ = ("cancelled", "claims", "created_at", "id", "live_items", "queues", "tasks")

    def __init__(self, scope_id: str, created_at: float | None) -> None:
        self.id = scope_id
        self.created_at = created_at  # wall clock of explicit creation, None if implicit
        self.cancelled: str | None = None  # the reason, once cancelled
        self.claims: dict[str, Claim] = {}
        self.tasks: dict[str, Item] = {}  # task key -> task
        self.queues: dict[str, Queue] = {}  # mailbox name -> this scope's queue
        self.live_items: dict[str, Item] = {}  # item id -> unfinished task or message

    def cancelled_message(self) -> str:
        return f"run {self.id!r} was cancelled: {self.cancelled}"

    def refuse_if_cancelled(self) -> None:
        """New work in a cancelled run is SCOPE_CANCELLED: the one place of that rule."""
        if self.cancelled is not None:
            raise CoreError(ErrorCode.SCOPE_CANCELLED, self.cancelled_message())
