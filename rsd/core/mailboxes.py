"""Mailbox definitions: a named queue's mode and retry policy, shared by every run.

``ensure`` is declarative: it creates the mailbox or brings its settings to the given
values; the settings apply to deliveries from then on. A mailbox must be ensured before
any run uses it (NOT_FOUND otherwise), so a typo in a name fails loudly instead of
creating a queue nobody consumes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODES", "Mailbox"]

MODES = ("WORK",)


class Mailbox:
    __slots__ = ("max_attempts", "mode", "name", "retry_backoff_ms")

    def __init__(self, name: str, mode: str, max_attempts: int, retry_backoff_ms: int) -> None:
        self.name = name
        self.mode = mode
        self.max_attempts = max_attempts
        self.retry_backoff_ms = retry_backoff_ms

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "max_attempts": self.max_attempts,
            "retry_backoff_ms": self.retry_backoff_ms,
        }
