"""A schedule: when it fires (every S seconds, or a cron expression in a time zone), and
which of its fire times are due at a wall-clock instant.

Fire times are whole seconds since the Unix epoch, computed, never read from a clock:
- ``every_seconds=S``: the multiples of S since the epoch (S=3600: on the hour, UTC), so
  a schedule ensured again, or on another node, keeps its phase;
- ``cron``: a 5-field expression (minute hour day month weekday), or 6 fields with
  seconds first, evaluated by cronsim in ``timezone`` (zoneinfo): on a daylight-saving
  change day a local time that does not exist fires once, at the first instant after the
  gap, and one that happens twice fires once, at its first occurrence (Debian cron's
  rules, which cronsim follows for 5-field expressions with fixed minute and hour).

What always holds:
- ``Spec.after(t)`` is the first fire time strictly after ``t``; ``Spec.at_or_before(t)``
  the last one not after ``t`` (None if there is none within cronsim's 50-year horizon);
- ``due(spec, first, wall, catch_up)`` picks, among the fire times in [first, wall], the
  ones to fire, oldest first, at most ``1 + MAX_SCHEDULE_CATCH_UP + late/period`` of
  them: a fire time at most ``Policy.SCHEDULE_LATE_SECONDS`` behind ``wall`` is on time
  and always fires; older ones were missed (rsd was down, or paused far longer than a
  tick) and follow ``catch_up``: "latest" the most recent of them, "all" the most recent
  ``Limits.MAX_SCHEDULE_CATCH_UP`` of them, "none" none. Its cost is bounded by that
  count, never by the number missed.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from rsproto import ErrorCode, Limits

from ...policy import Policy
from ..ground.errors import CoreError

if TYPE_CHECKING:
    from .scope import Scope

__all__ = ["CATCH_UPS", "Schedule", "Spec", "due", "fire_key", "iso"]

CATCH_UPS: Final = ("latest", "all", "none")
_LATE: Final = Policy.SCHEDULE_LATE_SECONDS
_MAX_ON_TIME: Final = int(_LATE) + 1  # fire times within the late window, each >= 1 s apart


def _bad(message: str) -> CoreError:
    return CoreError(ErrorCode.INVALID_ARGUMENT, message)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; INVALID_ARGUMENT naming it when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise _bad(f"timezone {name!r} is not a known IANA time zone (e.g. 'UTC', "
                   "'Europe/Berlin')") from None


class Spec:
    """When a schedule fires: ``every_seconds`` or ``cron`` (exactly one) in ``timezone``."""

    __slots__ = ("cron", "every_seconds", "timezone", "tz")

    def __init__(self, every_seconds: int | None, cron: str | None, timezone: str) -> None:
        self.every_seconds = every_seconds
        self.cron = cron
        self.timezone = timezone
        self.tz = zone(timezone)

    def check(self, wall: float) -> None:
        """Refuse (INVALID_ARGUMENT) a cron expression cronsim does not read, one that
        never fires, or one that fires more often than once a second."""
        if self.cron is None:
            return
        try:
            first = self.after(wall)
        except CronSimError as exc:
            raise _bad(f"cron {self.cron!r} is not a cron expression: {exc}") from None
        if first is None:
            raise _bad(f"cron {self.cron!r} never fires")

    def same(self, other: Spec) -> bool:
        return (self.every_seconds, self.cron, self.timezone) == (
            other.every_seconds, other.cron, other.timezone)

    def after(self, t: float) -> float | None:
        """The first fire time strictly after ``t``."""
        every = self.every_seconds
        if every is not None:
            return float((math.floor(t) // every + 1) * every)
        assert self.cron is not None
        start = datetime.fromtimestamp(math.floor(t), self.tz)
        try:
            return next(CronSim(self.cron, start)).timestamp()
        except StopIteration:
            return None

    def at_or_before(self, t: float) -> float | None:
        """The last fire time not after ``t``."""
        every = self.every_seconds
        if every is not None:
            return float(math.floor(t) // every * every)
        assert self.cron is not None
        start = datetime.fromtimestamp(math.floor(t) + 1, self.tz)
        try:
            return next(CronSim(self.cron, start, reverse=True)).timestamp()
        except StopIteration:
            return None


def due(spec: Spec, first: float, wall: float, catch_up: str) -> list[float]:
    """The fire times to fire now, oldest first (see the module docstring): ``first`` is
    the schedule's next fire time, not after ``wall``."""
    picked: list[float] = []
    t = spec.at_or_before(wall)
    while t is not None and t >= first and wall - t <= _LATE and len(picked) < _MAX_ON_TIME:
        picked.append(t)  # on time
        t = spec.at_or_before(t - 1)
    if t is not None and t >= first and wall - t > _LATE:  # missed ones remain
        keep = {"latest": 1, "all": Limits.MAX_SCHEDULE_CATCH_UP, "none": 0}[catch_up]
        while t is not None and t >= first and keep > 0:
            picked.append(t)
            keep -= 1
            t = spec.at_or_before(t - 1)
    picked.reverse()
    return picked


def iso(t: float) -> str:
    """A fire time as the task key shows it: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fire_key(name: str, t: float) -> str:
    """The task key of the fire of schedule ``name`` at ``t``: one task per fire time."""
    return f"schedule:{name}:{iso(t)}"


class Schedule:
    """One schedule of a run: its spec, the task data of each fire, its next fire time."""

    __slots__ = (
        "catch_up", "created", "data", "digest", "fired", "last_fire", "mailbox", "name",
        "next_wall", "paused", "scope", "size", "spec",
    )

    def __init__(
        self, scope: Scope, name: str, mailbox: str, spec: Spec, data: Any,
        digest: bytes | None, size: int, catch_up: str, next_wall: float, created: float,
    ) -> None:
        self.scope = scope
        self.name = name
        self.mailbox = mailbox
        self.spec = spec
        self.data = data
        self.digest = digest  # the fires' input digest (salted with the mailbox: intake.py)
        self.size = size  # data's stored size, charged to the tenant while it exists
        self.catch_up = catch_up
        self.next_wall = next_wall  # the next fire time (wall seconds)
        self.created = created
        self.paused = False
        self.fired = 0  # fires recorded (the due times of each SCHEDULE_FIRED)
        self.last_fire: float | None = None

    def same(self, other: Schedule) -> bool:
        """Whether ``other`` is this schedule's definition (ensuring it changes nothing)."""
        return self.spec.same(other.spec) and (self.mailbox, self.digest, self.catch_up) == (
            other.mailbox, other.digest, other.catch_up)

    def view(self, upcoming: int = 0) -> dict[str, Any]:
        """SCHEDULE_GET/LIST's view; ``upcoming``: that many next fire times (GET)."""
        spec = self.spec
        view: dict[str, Any] = {
            "name": self.name, "scope": self.scope.id, "mailbox": self.mailbox,
            "every_seconds": spec.every_seconds, "cron": spec.cron,
            "timezone": spec.timezone, "catch_up": self.catch_up, "data": self.data,
            "paused": self.paused, "next_fire": None if self.paused else self.next_wall,
            "last_fire": self.last_fire, "fires": self.fired, "created": self.created,
        }
        if upcoming:
            times: list[float] = []
            t: float | None = self.next_wall
            while t is not None and len(times) < upcoming and not self.paused:
                times.append(t)
                t = spec.after(t)
            view["next_fires"] = times
        return view
