"""When and in what order an item is delivered: the arguments of a submit or send that
say so (``delay_ms`` or ``not_before``, ``priority``, ``fairness_key``), checked once.

What always holds:
- ``delay_ms`` (an integer of milliseconds from now, the server's now) and
  ``not_before`` (a wall-clock instant in seconds, as ``deadline``) are one or the
  other, never both; neither may reach more than ``Limits.MAX_DELAY_MS`` ahead; a
  ``not_before`` already past (or a delay of 0) makes an item ready at once, as if it
  had none (its ``not_before`` is then nil);
- ``priority`` is an integer from 0 to ``Limits.MAX_PRIORITY`` (booleans are not
  integers here), 0 when absent; ``fairness_key`` a string of at most
  ``Limits.MAX_FAIRNESS_KEY_BYTES`` bytes, or nil;
- the priority is part of the input for idempotency, as needs are: ``salt`` adds it to
  the digest's salt only when it is not 0, so every digest made before priorities
  existed is unchanged; the delay and the fairness key are not input (a resubmit with
  another delay joins the task as it is).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from rsproto import Limits

from .validate import check_number, invalid, opt_text

__all__ = ["Order", "order_args"]

_MAX_DELAY_MS: Final = Limits.MAX_DELAY_MS
_MAX_PRIORITY: Final = Limits.MAX_PRIORITY
_MAX_FAIRNESS_KEY_BYTES: Final = Limits.MAX_FAIRNESS_KEY_BYTES


class Order(NamedTuple):
    """A new item's delay and place: ``not_before`` (wall clock, or None: ready at once),
    ``priority``, ``fairness_key``."""

    not_before: float | None
    priority: int
    fairness_key: str | None

    def salt(self) -> str:
        """What the priority adds to the digest's salt ("" for the default, 0)."""
        return f"\x00priority={self.priority}" if self.priority else ""


PLAIN: Final = Order(None, 0, None)


def order_args(args: dict[str, Any], wall_now: float) -> Order:
    """The Order a TASK_SUBMIT or MESSAGE_SEND asks for (INVALID_ARGUMENT naming the
    field for anything else). O(1)."""
    get = args.get
    delay = get("delay_ms")
    not_before = get("not_before")
    priority = get("priority")
    fairness_key = get("fairness_key")
    if delay is None and not_before is None and priority is None and fairness_key is None:
        return PLAIN  # the common case: one lookup each, nothing built
    horizon = _MAX_DELAY_MS / 1000.0
    if delay is not None:
        if not_before is not None:
            raise invalid("give delay_ms or not_before, not both")
        if type(delay) is not int:
            raise invalid(
                "delay_ms must be an integer number of milliseconds, got "
                + ("NaN" if delay != delay else type(delay).__name__)
            )
        check_number(delay, "delay_ms", 0, _MAX_DELAY_MS)
        not_before = wall_now + delay / 1000.0 if delay else None
    elif not_before is not None:
        check_number(not_before, "not_before", 0, 1e11)
        if not_before > wall_now + horizon:
            raise invalid(
                f"not_before may be at most {_MAX_DELAY_MS // 1000} seconds ahead, "
                f"got {not_before - wall_now:.0f} seconds ahead"
            )
        not_before = None if not_before <= wall_now else float(not_before)
    if priority is None:
        priority = 0
    elif type(priority) is not int or not 0 <= priority <= _MAX_PRIORITY:
        raise invalid(
            f"priority must be an integer from 0 to {_MAX_PRIORITY}, got "
            + (repr(priority) if type(priority) in (int, float) else type(priority).__name__)
        )
    if fairness_key is not None:
        fairness_key = opt_text(args, "fairness_key", _MAX_FAIRNESS_KEY_BYTES)
    return Order(not_before, priority, fairness_key)
