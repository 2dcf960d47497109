"""Over the wire, with a real rsd and a short --run-retention-seconds: a run that holds
nothing is freed (NotFoundError, then created anew by its id), one holding a task is
kept, and both facts survive a restart (RUN_FREED and the quiet window are journaled)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, NotFoundError

WINDOW = 1.1  # seconds a run that holds nothing is kept (the option takes more than 1)


async def _gone(rs: AsyncRunstate, run_id: str, within: float,
                since: float | None = None) -> float:
    """Seconds from ``since`` (default: now) until SCOPE_STATUS says NOT_FOUND for
    ``run_id`` (fails after ``within``)."""
    started = time.monotonic()
    since = started if since is None else since
    while time.monotonic() - started < within:
        try:
            await rs.scope(run_id).status()
        except NotFoundError:
            return time.monotonic() - since
        await asyncio.sleep(0.05)
    pytest.fail(f"run {run_id!r} was not freed within {within} s")


async def test_a_run_that_holds_nothing_is_freed_and_a_restart_keeps_what_was_decided(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("runs-end")
    flags = ("--run-retention-seconds", f"{WINDOW:g}")
    await server.start(*flags)
    async with AsyncRunstate(holder="job", address=server.address) as rs:
        await rs.mailboxes.ensure("jobs")
        asked = time.monotonic()  # its window begins after this
        quiet = await rs.scopes.create(id="quiet")
        keep = await rs.scopes.create(id="keep")
        await keep.mailbox("jobs").submit(key="t", data=1)
        waited = await _gone(rs, quiet.id, within=30.0, since=asked)
        assert waited > WINDOW / 3  # not at once: it was kept for its window
        assert (await keep.status())["state"] == "open"
        later = await rs.scopes.create(id="later")  # holds nothing at the restart
    await server.restart(*flags)
    restarted_at = time.monotonic()
    async with AsyncRunstate(holder="job", address=server.address) as rs:
        with pytest.raises(NotFoundError):  # RUN_FREED was journaled
            await rs.scope("quiet").claim("k").acquire()
        await _gone(rs, later.id, within=30.0)  # its window came back with it
        # Two thirds of a window more than a window after the restart (the time waiting
        # for "later" counts): past a window the restart could have given "keep", had it
        # forgotten that "keep" holds a task.
        await asyncio.sleep(max(0.0, restarted_at + WINDOW * 5 / 3 - time.monotonic()))
        assert (await rs.scope("keep").status())["tasks"] == {"PENDING": 1}
        again = await rs.scopes.create(id="quiet")
        assert again.created is True and (await again.status())["state"] == "open"
