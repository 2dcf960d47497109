"""Schedules: ``run.schedules`` submits a task into a mailbox of the run at fire times.

``await run.schedules.ensure("nightly", mailbox="reports", cron="0 3 * * *",
timezone="Europe/Berlin", data={...})`` or ``every_seconds=60``: each fire submits the
task keyed ``schedule:<name>:<fire time>`` (the fire time in ISO 8601 UTC) into that
mailbox of the run, so a fire happens once per fire time across restarts and takeovers:
the key makes a repeat a join, never a second task. Workers consume those tasks like any
other. Fire times missed while the server was down follow ``catch_up``: ``"latest"``
(one fire, for the most recent), ``"all"`` (each, at most the 100 most recent) or
``"none"``. ``ensure`` is declarative (the same definition again changes nothing);
``list()``, ``get(name)`` (with its next fire times), ``pause``, ``resume`` and
``delete`` do what they say. The server lists schedules a page at a time, as every
listing (``page()``: one page and the cursor to go on from; ``iter()``: every page;
``list()``: every schedule, by name), and a page of schedules with large data holds a
few of them only, so that it fits a frame. Bad input raises InvalidArgumentError naming
what is wrong (a cron expression that does not parse, an unknown time zone, both or
neither of ``every_seconds`` and ``cron``); past the server's bounds (100 per run, 1000 per tenant)
ResourceExhaustedError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal, cast

from .wire import Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Schedules"]

CatchUp = Literal["latest", "all", "none"]


class Schedules:
    """``run.schedules``: the schedules of one run. Making one does no I/O."""

    def __init__(self, session: Session, scope: str) -> None:
        self._session = session
        self.scope = scope

    def __repr__(self) -> str:
        return f"<Schedules of {self.scope}>"

    async def ensure(
        self,
        name: str,
        *,
        mailbox: str,
        every_seconds: int | None = None,
        cron: str | None = None,
        data: Any = None,
        timezone: str = "UTC",
        catch_up: CatchUp = "latest",
    ) -> dict[str, Any]:
        """Create the schedule ``name``, or bring it to this definition; give exactly one
        of ``every_seconds`` (an integer of at least 1: fires at its multiples since the
        Unix epoch) and ``cron`` (5 fields, or 6 with seconds first, read in
        ``timezone``). Returns the schedule (``name``, ``mailbox``, ``every_seconds``,
        ``cron``, ``timezone``, ``catch_up``, ``data``, ``paused``, ``next_fire``,
        ``last_fire``, ``fires``) and ``created``: whether this call made it."""
        args: dict[str, Any] = {
            "scope": self.scope, "name": name, "mailbox": mailbox, "data": data,
            "timezone": timezone, "catch_up": catch_up,
        }
        if every_seconds is not None:
            args["every_seconds"] = every_seconds
        if cron is not None:
            args["cron"] = cron
        return cast("dict[str, Any]", await self._session.call(Op.SCHEDULE_ENSURE, args))

    async def page(
        self, *, cursor: int = 0, limit: int | None = None, newest_first: bool = False
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One page of the run's schedules, in the order they were ensured (newest first
        with ``newest_first``), and the cursor to go on from (None once the listing is
        complete). ``limit``: 1 to 1000 schedules (the server's default 100); a page
        also stops before its schedules' data would pass the frame limit."""
        args: dict[str, Any] = {"scope": self.scope, "cursor": cursor}
        if limit is not None:
            args["limit"] = limit
        if newest_first:
            args["newest_first"] = True
        reply = await self._session.call(Op.SCHEDULE_LIST, args)
        return cast("list[dict[str, Any]]", reply["schedules"]), reply.get("next")

    async def iter(
        self, *, limit: int | None = None, newest_first: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """Every schedule of the run, page after page (``page``'s order and ``limit``)."""
        cursor: int | None = 0
        while cursor is not None:
            found, cursor = await self.page(cursor=cursor, limit=limit,
                                            newest_first=newest_first)
            for schedule in found:
                yield schedule

    async def list(self) -> list[dict[str, Any]]:
        """The run's schedules, by name (at most 100), read page after page."""
        found = [schedule async for schedule in self.iter()]
        return sorted(found, key=lambda schedule: str(schedule["name"]))

    async def get(self, name: str, *, next: int = 5) -> dict[str, Any]:
        """The schedule ``name`` with ``next_fires``: its next ``next`` fire times (Unix
        seconds; 1 to 10; none while paused). NotFoundError if it does not exist."""
        return cast("dict[str, Any]", await self._session.call(
            Op.SCHEDULE_GET, {"scope": self.scope, "name": name, "next": next}
        ))

    async def pause(self, name: str) -> dict[str, Any]:
        """Stop it firing until ``resume``; the schedule. Pausing again changes nothing."""
        return cast("dict[str, Any]", await self._session.call(
            Op.SCHEDULE_PAUSE, {"scope": self.scope, "name": name}
        ))

    async def resume(self, name: str) -> dict[str, Any]:
        """Fire again from its next fire time after now (fire times passed while paused
        do not fire); the schedule."""
        return cast("dict[str, Any]", await self._session.call(
            Op.SCHEDULE_RESUME, {"scope": self.scope, "name": name}
        ))

    async def delete(self, name: str) -> bool:
        """Delete it (the tasks it submitted stay); True. NotFoundError if it does not
        exist."""
        reply = await self._session.call(
            Op.SCHEDULE_DELETE, {"scope": self.scope, "name": name}
        )
        return bool(reply["deleted"])
