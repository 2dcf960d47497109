"""A data directory removed under a running rsd (``rm -rf``) stops it (exit 74, as a
failed write does) before it acknowledges anything more: before, rsd went on answering
submits into unlinked files (300 more acknowledged, then lost at the restart).

Two paths, one test each: under a submit load the first batch after the journal segment
was unlinked finds it so (one fstat per batch and per fsync, journal.py) and rsd exits
unanswered; an idle rsd finds its directory gone at its next check (datadir.py, twice a
second). The assertion is on the recorded history, not on timing: each submitter has at
most one submit in flight, so once the removal is complete each may still get at most
the answer to the one it had sent (released just before); none after that one."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from support.process import Rsd

from rsclient import AsyncRunstate, RunstateError
from rsd.journal import EXIT_IO_ERROR

SUBMITTERS = 8


def remove(path: Path) -> float:
    """``rm -rf path`` (again while rsd is still making files in it); when it was gone."""
    while path.exists():
        shutil.rmtree(path, ignore_errors=True)
    return time.monotonic()


async def test_under_a_submit_load_nothing_is_acknowledged_after_the_removal(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    address = await server.start()
    acks: list[tuple[int, float]] = []  # (submitter, when its answer came)
    failed: list[BaseException] = []
    stop = asyncio.Event()
    async with AsyncRunstate(holder="writer", address=address) as rs:
        await rs.scopes.create(id="s")
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")

        async def submitter(n: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    await asyncio.wait_for(box.submit({"n": i}, key=f"{n}-{i}"), 10)
                except (RunstateError, TimeoutError) as exc:
                    failed.append(exc)
                    return
                acks.append((n, time.monotonic()))

        tasks = [asyncio.create_task(submitter(n)) for n in range(SUBMITTERS)]
        while len(acks) < 200:  # the load runs
            await asyncio.sleep(0.02)
        gone = await asyncio.to_thread(remove, server.data)
        code = await server.exited(15)
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)
    assert code == EXIT_IO_ERROR, server.log()
    assert "exiting without acknowledging" in server.log()
    late: dict[int, int] = {}
    for n, when in acks:
        if when > gone:
            late[n] = late.get(n, 0) + 1
    assert all(count <= 1 for count in late.values()), (late, server.log())
    assert len(failed) == SUBMITTERS  # every submitter's last submit was refused or lost


async def test_an_idle_rsd_notices_its_directory_removed(rsds: Callable[..., Rsd]) -> None:
    server = rsds()
    await server.start()
    remove(server.data)
    assert await server.exited(15) == EXIT_IO_ERROR
    assert f"data directory {server.data} is gone" in server.log()
