"""Over the wire, with the Python SDK: ``rs.mailboxes.pause(name)`` holds a mailbox in
every run and ``run.mailbox(name).pause()`` in one run; a paused queue takes submits
but delivers nothing, a parked receive is served the moment it is resumed, and both
pauses outlive a kill -9 (MAILBOX_PAUSED is journaled before the pause is answered).
The core rules are tests/test_core_a_paused_mailbox_takes_work_but_delivers_none_until_resumed.py's;
this one's reason to exist is the SDK's calls and the journal of a real process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, InvalidArgumentError, NotFoundError
from tests.support import aio


async def _parked(box: object, count: int) -> None:
    """Until ``count`` receives are parked on ``box`` (a condition, not a time)."""
    while (await box.inspect())["consumers"] != count:  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)


async def test_pauses_hold_deliveries_and_survive_a_kill_9(rsds: Callable[..., Rsd]) -> None:
    server = rsds("paused")
    address = await server.start()
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        await rs.mailboxes.ensure("jobs")
        await rs.mailboxes.ensure("mail")
        run = await rs.scopes.create(id="r")
        jobs, mail = run.mailbox("jobs"), run.mailbox("mail")
        assert (await rs.mailboxes.pause("jobs"))["paused"] is True
        assert (await rs.mailboxes.pause("jobs"))["paused"] is True  # idempotent
        ticket = await jobs.submit({"n": 1})
        assert await jobs.receive() is None
        assert (await jobs.inspect())["paused"] is True
        parked = asyncio.ensure_future(jobs.receive(wait=True, timeout_ms=120_000))
        await asyncio.wait_for(_parked(jobs, 1), 30)
        await rs.mailboxes.resume("jobs")
        delivery = await asyncio.wait_for(parked, 30)
        assert delivery is not None and delivery.task_id == ticket.id
        await delivery.complete({"payload": "ok"})
        # Paused again for every run, and "mail" in run "r" alone; then kill -9.
        await rs.mailboxes.pause("jobs")
        assert (await mail.pause())["paused"] is True
        await jobs.submit({"n": 2})
        await mail.send("hello")
    finally:
        await aio.close_quietly(rs)
    await server.kill()
    address = await server.start()
    async with AsyncRunstate(holder="worker", address=address) as rs:
        run = rs.scope("r")
        jobs, mail = run.mailbox("jobs"), run.mailbox("mail")
        assert (await jobs.inspect())["paused"] is True
        assert (await mail.inspect())["paused"] is True
        assert await jobs.receive() is None and await mail.receive() is None
        await rs.mailboxes.resume("jobs")
        await mail.resume()
        got = await jobs.receive()
        assert got is not None and got.data == {"n": 2}
        message = await mail.receive()
        assert message is not None and message.data == "hello"
        with pytest.raises(NotFoundError):
            await rs.mailboxes.pause("nope")
        with pytest.raises(InvalidArgumentError):
            await rs.mailboxes.pause(7)  # type: ignore[arg-type]
    assert await server.stop() == 0
