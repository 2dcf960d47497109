"""A data directory removed under a running rsd (``rm -rf``) stops it (exit 74, as a
failed write does) before it acknowledges anything more: before, rsd went on answering
submits into unlinked files (300 more acknowledged, then lost at the restart).

Two paths, one test each: under a submit load the first batch after the journal segment
was unlinked finds it so (one fstat per batch and per fsync, journal.py) and rsd exits
unanswered; an idle rsd finds its directory gone at its next check (datadir.py, twice
a second) and tells each connection UNAVAILABLE first. The assertion is on the recorded
history, not on timing: each submitter has at most one submit in flight, so once the
removal is complete each may still get at most the answer to the one it had sent
(released just before); none after that one."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from support.process import Rsd
from support.raw import RawConn

from rsclient import AsyncRunstate, RunstateError
from rsd.disk.journal import EXIT_IO_ERROR

SUBMITTERS = 8


def remove(path: Path) -> float:
    """``rm -rf path`` (again while rsd is still making files in it); when it was gone."""
    for _ in range(100):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return time.monotonic()
    raise AssertionError(f"{path} could not be removed")


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
        for _ in range(3000):  # the load runs (at most 60 s on a loaded machine)
            if len(acks) >= 200 or all(task.done() for task in tasks):
                break
            await asyncio.sleep(0.02)
        assert len(acks) >= 200, (failed, server.log())
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
    assert failed  # the submits in flight at the stop failed (UNAVAILABLE), none succeeded


async def test_an_idle_rsd_notices_its_directory_removed_and_tells_its_clients(
    rsds: Callable[..., Rsd], raw_connect: Callable[..., Awaitable[RawConn]],
) -> None:
    server = rsds()
    conn = await raw_connect(await server.start())
    await conn.hello()
    remove(server.data)
    _, message = await conn.closed_with("UNAVAILABLE", timeout=15)
    assert message == (
        f"rsd is stopping: data directory {server.data} is gone (No such file or directory)"
    )
    assert await server.exited(15) == EXIT_IO_ERROR
    assert f"data directory {server.data} is gone" in server.log()
