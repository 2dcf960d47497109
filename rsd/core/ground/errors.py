"""The core's one exception: a refused request, carrying a wire error code.

Raising is how an op handler refuses; the server turns it into an ERROR frame. Nothing
the core raises for a client's mistake is anything but a CoreError.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode

__all__ = ["CoreError"]


class CoreError(Exception):
    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
