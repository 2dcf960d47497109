"""The SDK's typed exceptions: one class per kind of failure, each carrying ``.code``.

``error_for(code, message)`` is the single place where a wire error code becomes an
exception, so every call site raises the same class for the same code; which class is
``rsproto.sdkrules.ERROR_CLASSES``, the table the TypeScript SDK follows too.
"""

from __future__ import annotations

from typing import Any

from rsproto.sdkrules import ERROR_CLASSES

from .wire import ErrorCode

__all__ = [
    "AuthenticationError",
    "CancelledError",
    "ConflictError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "RunstateError",
    "ScopeCancelledError",
    "UnavailableError",
    "WaitTimeoutError",
    "checked_bool",
    "error_for",
]


class RunstateError(Exception):
    """Base of every error the SDK raises; ``code`` is the wire error code (a str)."""

    default_code = ErrorCode.INTERNAL

    def __init__(
        self, message: str, code: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = str(code or self.default_code)
        self.details = details or {}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConflictError(RunstateError):
    """CLAIM_HELD (someone else owns the key), IDEMPOTENCY_CONFLICT, POOL_FULL (no free
    slot, not waiting) or QUOTA_EXHAUSTED (not enough budget, not waiting)."""

    default_code = ErrorCode.CLAIM_HELD


class LeaseLostError(RunstateError):
    """STALE_CLAIM: the lease ended (expired, released, taken over) before this call."""

    default_code = ErrorCode.STALE_CLAIM


class WaitTimeoutError(RunstateError, TimeoutError):
    """WAIT_TIMEOUT: a server-side wait ran out (``timeout_ms``)."""
    default_code = ErrorCode.WAIT_TIMEOUT


class ScopeCancelledError(RunstateError):
    """SCOPE_CANCELLED: the run was cancelled and refuses new work."""
    default_code = ErrorCode.SCOPE_CANCELLED


class NotFoundError(RunstateError):
    """NOT_FOUND: a run never created, or a mailbox, pool, quota or task that does not exist."""
    default_code = ErrorCode.NOT_FOUND


class InvalidArgumentError(RunstateError, ValueError):
    """INVALID_ARGUMENT: a malformed request or argument, refused before or by the server."""
    default_code = ErrorCode.INVALID_ARGUMENT


class AuthenticationError(RunstateError):
    """UNAUTHENTICATED: the server refused the token (wrong, missing or revoked); never retried."""
    default_code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(RunstateError):
    """PERMISSION_DENIED: an admin-only operation asked with a client token."""

    default_code = ErrorCode.PERMISSION_DENIED


class UnavailableError(RunstateError, ConnectionError):
    """The server could not be reached, or the connection dropped before a reply; or
    (code NOT_PRIMARY) a cluster node that is not the primary answered and the client
    could not follow it: ``details`` ``{"primary": "HOST:PORT" | None, "epoch": N}``."""

    default_code = ErrorCode.UNAVAILABLE


class CancelledError(RunstateError):
    """CANCELLED: the answer to a wait this client withdrew (CANCEL). The caller who gave
    up was told already, by asyncio's own CancelledError; this is the class the shared
    table gives the code (``rsproto.sdkrules``), should its answer reach anyone."""

    default_code = ErrorCode.CANCELLED


_CLASSES: dict[str, type[RunstateError]] = {
    cls.__name__: cls
    for cls in (
        RunstateError, ConflictError, LeaseLostError, WaitTimeoutError, ScopeCancelledError,
        NotFoundError, InvalidArgumentError, AuthenticationError, PermissionDeniedError,
        UnavailableError, CancelledError,
    )
}
_BY_CODE: dict[str, type[RunstateError]] = {
    code: _CLASSES[name] for code, name in ERROR_CLASSES.items()
}


def error_for(code: str, message: str, details: dict[str, Any] | None = None) -> RunstateError:
    """The RunstateError subclass for ``code`` (RunstateError itself for an unknown one)."""
    return _BY_CODE.get(code, RunstateError)(message, code, details)


def checked_bool(value: object, name: str = "release_on_disconnect") -> bool:
    """``value`` if it is a bool, else InvalidArgumentError naming ``name`` (checked in
    the caller's call, before anything is sent)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, got {type(value).__name__}")
    return value
