"""Work items: shared tasks and plain messages, and the one table of their states.

Everything that changes an item's state goes through ``transition``: a move that is
not in ``TRANSITIONS`` is a bug in rsd, never a client's doing, and raises. protocol.md
prints the same table and a test checks that they agree.

A task lives in its scope under its key (when it has one) and is read by id; a message
is a task without a result: nobody waits for it, and it is forgotten once consumed,
except for its ``work_key`` dedupe entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import msgpack

from .leases import Lease

__all__ = [
    "STATE_BY_NAME",
    "TERMINAL",
    "TRANSITIONS",
    "Item",
    "State",
    "canonical_digest",
    "nested_deeper_than",
    "transition",
]


class State(StrEnum):
    PENDING = "PENDING"  # queued (or waiting out a retry backoff) for a worker
    RUNNING = "RUNNING"  # delivered to a worker under a live lease
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"


STATE_BY_NAME = {state.value: state for state in State}
NO_SUBSCRIBERS: Mapping[str, str | None] = MappingProxyType({})

TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED})

# (state, event) -> next state. The only legal moves.
TRANSITIONS: dict[tuple[State, str], State] = {
    (State.PENDING, "deliver"): State.RUNNING,
    (State.RUNNING, "complete"): State.SUCCEEDED,
    (State.RUNNING, "retry"): State.PENDING,
    (State.RUNNING, "release"): State.PENDING,
    (State.RUNNING, "lease_expired"): State.PENDING,
    (State.RUNNING, "reject"): State.FAILED,
    (State.RUNNING, "attempts_exhausted"): State.FAILED,
    (State.PENDING, "cancel"): State.CANCELLED,
    (State.RUNNING, "cancel"): State.CANCELLED,
    (State.PENDING, "deadline"): State.EXPIRED,
    (State.RUNNING, "deadline"): State.EXPIRED,
}


def transition(state: State, event: str) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise AssertionError(f"illegal task transition: {event} in {state}") from None


def _canonical(value: Any) -> Any:
    if type(value) is dict:
        return {
            k: _canonical(value[k])
            for k in sorted(value, key=lambda k: (type(k).__name__, k))
        }
    if type(value) in (list, tuple):
        return [_canonical(v) for v in value]
    return value


_CONTAINERS = (dict, list, tuple)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether maps and arrays nest more than ``limit`` levels (a scalar is level 0)."""
    kind = type(value)
    if kind not in _CONTAINERS:
        return False
    if limit == 0:
        return True
    children = value.values() if kind is dict else value
    return any(type(v) in _CONTAINERS and nested_deeper_than(v, limit - 1) for v in children)


def canonical_digest(value: Any, salt: str = "") -> tuple[bytes, int]:
    """Digest of a value with every map's keys in sorted order (equal input, equal
    digest), salted with ``salt``; and the value's encoded size, so that the caller
    need not encode it a second time to check its size."""
    encoded = msgpack.packb(_canonical(value), use_bin_type=True)
    digest = hashlib.blake2b(encoded, digest_size=16, person=b"rsd-input")
    digest.update(salt.encode())
    return digest.digest(), len(encoded)


class Item:
    """A task or a message. ``key`` is the task key or the message's work_key."""

    __slots__ = (
        "attempt", "created_at", "data", "dead", "deadline", "delivery", "digest",
        "finished_at", "id", "is_message", "key", "mailbox", "outcome", "queued", "reason",
        "scope", "state", "subscribers", "tombstoned", "visible_at", "watchers",
    )

    def __init__(
        self,
        item_id: str,
        is_message: bool,
        scope: str,
        mailbox: str,
        key: str | None,
        digest: bytes | None,
        data: Any,
        created_at: float,
        deadline: float | None,
    ) -> None:
        self.id = item_id
        self.is_message = is_message
        self.scope = scope
        self.mailbox = mailbox
        self.key = key
        self.digest = digest
        self.data = data
        self.created_at = created_at  # wall clock
        self.deadline = deadline  # wall clock, or None
        self.state = State.PENDING
        self.attempt = 0  # deliveries so far; the next delivery is attempt + 1
        self.outcome: Any = None
        self.reason: str | None = None
        self.finished_at: float | None = None
        self.tombstoned = False
        self.dead = False
        self.delivery: Lease | None = None
        self.queued = False  # sitting in its queue's ready line
        self.visible_at = 0.0  # wall clock before which it is not delivered (backoff)
        # Most items never have either: share empty ones, made real on first use.
        self.subscribers: Mapping[str, str | None] = NO_SUBSCRIBERS  # id -> its scope
        self.watchers: list[Any] | tuple[()] = ()  # pending result waits

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "mailbox": self.mailbox,
            "key": self.key,
            "state": self.state.value,
            "attempt": self.attempt,
            "outcome": self.outcome,
            "reason": self.reason,
            "tombstoned": self.tombstoned,
            "subscribers": sorted(self.subscribers),
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "deadline": self.deadline,
        }
