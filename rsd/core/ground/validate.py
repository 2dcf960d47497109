"""Argument checks at the boundary of every op: types, sizes and ranges.

Each function reads one field from a request's args map and either returns it in the
form the core uses or raises CoreError(INVALID_ARGUMENT) with a message that names the
field, says what was expected and what came. Every limit comes from ``rsproto.Limits``.
"""

from __future__ import annotations

from typing import Any, Final, TypeGuard

from rsproto import LEASE_HANDLE_BYTES, ErrorCode, Limits

from .errors import CoreError

__all__ = [
    "int_arg",
    "invalid",
    "is_handle",
    "opt_bool",
    "opt_number",
    "opt_text",
    "req_handle",
    "req_id",
    "req_list",
    "req_text",
]

_DEFAULT_LEASE_SECONDS: Final = Limits.DEFAULT_LEASE_SECONDS
_MAX_LEASE_SECONDS: Final = Limits.MAX_LEASE_SECONDS

_MISSING: Final = object()


def invalid(message: str) -> CoreError:
    return CoreError(ErrorCode.INVALID_ARGUMENT, message)


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def req_text(args: dict[str, Any], name: str, max_bytes: int) -> str:
    """A required non-empty string of at most ``max_bytes`` UTF-8 bytes."""
    value = args.get(name, _MISSING)
    if value is _MISSING:
        raise invalid(f"{name} is required")
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string, got {_type_name(value)}")
    if not value:
        raise invalid(f"{name} must not be empty")
    # A character is at most 4 bytes in UTF-8: a short string is encoded only if it could
    # be over the limit.
    chars = len(value)
    if chars * 4 > max_bytes and (chars > max_bytes or len(value.encode()) > max_bytes):
        size = len(value.encode())
        raise invalid(f"{name} is {size} bytes long; the limit is {max_bytes} bytes (UTF-8)")
    return value


def opt_text(args: dict[str, Any], name: str, max_bytes: int) -> str | None:
    """An optional string; absent or nil gives None, otherwise as ``req_text``."""
    if args.get(name) is None:
        return None
    return req_text(args, name, max_bytes)


def req_id(args: dict[str, Any], name: str) -> int:
    """A required non-negative integer identifier (lease ids, request ids)."""
    value = args.get(name, _MISSING)
    if value is _MISSING:
        raise invalid(f"{name} is required")
    if type(value) is not int or value < 0:
        raise invalid(f"{name} must be a non-negative integer, got {value!r}")
    return value


def is_handle(value: object) -> TypeGuard[bytes]:
    return type(value) is bytes and len(value) == LEASE_HANDLE_BYTES


def req_handle(args: dict[str, Any], name: str = "lease") -> bytes:
    """A required lease handle: a bin of LEASE_HANDLE_BYTES bytes, as the grant gave it."""
    value = args.get(name, _MISSING)
    if value is _MISSING:
        raise invalid(f"{name} is required")
    if not is_handle(value):
        raise invalid(
            f"{name} must be the lease handle from the grant (a bin of "
            f"{LEASE_HANDLE_BYTES} bytes), got {_type_name(value)}"
        )
    return value


def req_list(args: dict[str, Any], name: str, max_items: int) -> list[Any]:
    value = args.get(name, _MISSING)
    if value is _MISSING:
        raise invalid(f"{name} is required")
    if not isinstance(value, list):
        raise invalid(f"{name} must be an array, got {_type_name(value)}")
    if len(value) > max_items:
        raise invalid(f"{name} has {len(value)} items; the limit is {max_items}")
    return value


def opt_bool(args: dict[str, Any], name: str, default: bool) -> bool:
    value = args.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean, got {_type_name(value)}")
    return value


def opt_number(
    args: dict[str, Any], name: str, default: float, low: float, high: float
) -> float:
    """An optional int or float within [low, high]; booleans are not numbers here."""
    value = args.get(name)
    if value is None:
        return default
    return check_number(value, name, low, high)


def int_arg(
    args: dict[str, Any], name: str, low: int, high: int, default: int | None = None
) -> int:
    """An integer within [low, high]; required unless a ``default`` is given (then absent
    or nil gives the default). A float, even a whole one, is not an integer here."""
    value = args.get(name)
    if value is None:
        if default is None:
            raise invalid(f"{name} is required")
        return default
    if type(value) is not int:
        raise invalid(f"{name} must be an integer, got {_type_name(value)}")
    if not low <= value <= high:
        raise invalid(f"{name} must be between {low} and {high}, got {value!r}")
    return value


def check_number(value: Any, name: str, low: float, high: float) -> float:
    # (``type(value) not in (int, float)``, compiled, compares the types by two rich
    # comparisons; only a float can be NaN)
    kind = type(value)
    if kind is not int and kind is not float:
        raise invalid(f"{name} must be a number, got {_type_name(value)}")
    if kind is float and value != value:
        raise invalid(f"{name} must be a number, got NaN")
    if not low <= value <= high:
        raise invalid(f"{name} must be between {_bound(low)} and {_bound(high)}, got {value!r}")
    number: float = value  # an int or a float, as checked
    return number


def _bound(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def lease_seconds(args: dict[str, Any], shortest: float, name: str = "lease_seconds") -> float:
    """A lease length from ``shortest`` (the server's minimum, ``Tables.min_lease_seconds``:
    ``Limits.MIN_LEASE_SECONDS`` unless rsd's own tests lowered it) to the protocol's
    maximum; the protocol's default when absent."""
    return opt_number(
        args,
        name,
        _DEFAULT_LEASE_SECONDS,
        shortest,
        _MAX_LEASE_SECONDS,
    )
