"""A mailbox definition (a named queue's mode and retry policy, shared by every run of
one tenant) and its depth over all those runs: the objects mailboxbook.py ensures and the
queues (queue.py) count in.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MODES", "Depth", "Mailbox"]

MODES: Final = ("WORK",)


class Depth:
    """A mailbox's items over all its runs: ``ready`` (in a ready line) and ``running``
    (under a delivery lease). Kept by the queues as items move (queue.py), so reading a
    mailbox's depth is O(1), never a walk over its runs.

    Shared by the mailbox and its queues, it also carries what they share of a pause
    (work/pauses.py): ``paused``, the mailbox paused for every run of its tenant, read
    by each queue in O(1); ``parked``, the queues that have parked receives while it is
    paused, served at once on its resume without a walk over the runs."""

    __slots__ = ("parked", "paused", "ready", "running")

    def __init__(self) -> None:
        self.ready = 0
        self.running = 0
        self.paused = False
        # (the queues, run/queue.py's Queue: a floor above, so not named here)
        self.parked: dict[Any, None] = {}


class Mailbox:
    __slots__ = (
        "depth", "fairness_keys", "max_attempts", "mode", "name", "retry_backoff_ms", "tenant",
    )

    def __init__(
        self, tenant: str, name: str, mode: str, max_attempts: int, retry_backoff_ms: int
    ) -> None:
        self.tenant = tenant
        self.name = name
        self.mode = mode
        self.max_attempts = max_attempts
        self.retry_backoff_ms = retry_backoff_ms
        self.depth = Depth()
        # live fairness keys -> how many unfinished items of its queues carry each
        # (workbook.py keeps it; at most Policy.MAX_FAIRNESS_KEYS_PER_MAILBOX keys)
        self.fairness_keys: dict[str, int] = {}

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "max_attempts": self.max_attempts,
            "retry_backoff_ms": self.retry_backoff_ms,
            "paused": self.depth.paused,
        }
