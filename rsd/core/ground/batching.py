"""Fewer round trips: the args and reply shapes of batched receives and settle-and-next.

What always holds:
- ``max`` on RECEIVE (and in a settlement's ``next``) is an integer from 1 to
  ``Limits.MAX_RECEIVE_BATCH``; without it a RECEIVE answers ``{"delivery": d | nil}``
  exactly as before, with it ``{"deliveries": [...]}`` (possibly empty);
- a batch never holds more than ``max`` deliveries, and stops before the data of its
  deliveries would pass ``Limits.MAX_RECEIVE_BATCH_BYTES`` in total (the first is always
  given: one payload fits a frame), so a batched reply always fits a frame;
- ``next`` on DELIVERY_COMPLETE / RETRY / REJECT is a map (``lease_seconds``, ``max``,
  ``release_on_disconnect``, as RECEIVE's), checked before the settlement changes
  anything; it never parks.
The taking itself is ``Deliveries.take``: one rule for receive, dispatch and next; the
handler of a settlement with its ``next`` is ``Settlement.settle_and_next``.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import Limits

from .errors import CoreError
from .validate import int_arg, invalid, lease_seconds, opt_bool

__all__ = ["NextArgs", "batch_reply", "next_args", "receive_max"]

_MAX_RECEIVE_BATCH: Final = Limits.MAX_RECEIVE_BATCH

# (lease_seconds, max, release_on_disconnect) of a settlement's next receive
NextArgs = tuple[float, int, bool]


def receive_max(args: dict[str, Any]) -> int | None:
    """RECEIVE's ``max``: None when absent (the single-delivery reply), else 1..limit."""
    if args.get("max") is None:
        return None
    return int_arg(args, "max", 1, _MAX_RECEIVE_BATCH)


def next_args(args: dict[str, Any], shortest: float, value: Any = None) -> NextArgs | None:
    """A settlement's ``next`` (``value``, when the caller has read it): None when
    absent or nil, else its (lease_seconds, max, release_on_disconnect); ``shortest``
    is the server's minimum lease (``Tables.min_lease_seconds``)."""
    if value is None:
        value = args.get("next")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(
            "next must be a map (lease_seconds, max, release_on_disconnect) or nil, got "
            f"{_name(value)}"
        )
    try:
        return (
            lease_seconds(value, shortest), receive_max(value) or 1,
            opt_bool(value, "release_on_disconnect", False),
        )
    except CoreError as exc:  # name the field as the client sees it
        raise invalid(f"next.{exc.message}") from None


def batch_reply(many: int | None, taken: list[dict[str, Any]]) -> dict[str, Any]:
    """RECEIVE's reply: the old single form without ``max``, the list form with it."""
    if many is None:
        return {"delivery": taken[0] if taken else None}
    return {"deliveries": taken}


def _name(value: object) -> str:
    return "nil" if value is None else type(value).__name__
