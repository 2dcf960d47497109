"""Limits by key through rsclient (async and sync) against a real rsd: ``submit(...,
concurrency_key=, concurrency_limit=)`` and ``rate_key=, rate_limit=,
rate_period_seconds=`` reach the server, a held task shows the key that holds it
(``held_by``), bad combinations are refused, and the keys outlive a kill -9 (ITEM_LIMITED
is journaled before the submit is answered; the running count is rebuilt from the
running task). The rules themselves are tested on the fake clock in
tests/test_core_a_task_held_by_its_key_holds_back_no_other_key.py; this file's reasons
to exist are the SDK's arguments over the wire and the journal of a real process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, InvalidArgumentError
from rsclient.sync import Runstate
from tests.support import aio


async def test_a_key_holds_back_its_tasks_only_and_survives_a_kill_9(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("keys")
    address = await server.start()
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        await rs.mailboxes.ensure("jobs")
        box = (await rs.scopes.create(id="r")).mailbox("jobs")
        first = await box.submit("a0", concurrency_key="user:42", concurrency_limit=1)
        held = await box.submit("a1", concurrency_key="user:42", concurrency_limit=1)
        await box.submit("b0", rate_key="api", rate_limit=1, rate_period_seconds=3600)
        await box.submit("b1", rate_key="api", rate_limit=1, rate_period_seconds=3600)
        running = await box.receive(lease_seconds=600)
        other = await box.receive(lease_seconds=600)
        assert running is not None and running.data == "a0" and running.id == first.id
        assert other is not None and other.data == "b0"  # a0's key holds a1, not b0
        assert await box.receive() is None
        view = await held.status()
        assert view["limits"] == {"concurrency_key": "user:42", "concurrency_limit": 1}
        assert view["held_by"] == {"kind": "concurrency", "key": "user:42", "limit": 1,
                                   "running": 1}
        for kwargs in (
            {"concurrency_key": "k"}, {"concurrency_limit": 1},
            {"concurrency_key": "k", "concurrency_limit": 0}, {"rate_key": "r"},
            {"rate_limit": 3}, {"rate_key": "r", "rate_limit": 1, "rate_period_seconds": 0},
        ):
            with pytest.raises(InvalidArgumentError):
                await box.submit(1, **kwargs)  # type: ignore[arg-type]
    finally:
        await aio.close_quietly(rs)
    await server.kill()
    address = await server.start()
    async with AsyncRunstate(holder="worker", address=address) as rs:
        box = rs.scope("r").mailbox("jobs")
        # a0 still runs under its lease: a1 is held; b0's period (an hour) holds b1
        assert await box.receive() is None
        assert (await rs.scope("r").task(held.id).status())["state"] == "PENDING"
    assert await server.stop() == 0


def test_the_sync_client_submits_with_key_limits(rsd: Rsd) -> None:
    with Runstate(holder="sync", address=rsd.address) as rs:
        rs.mailboxes.ensure("jobs")
        box = rs.scopes.create().mailbox("jobs")
        box.submit("x", concurrency_key="k", concurrency_limit=1)
        box.submit("y", concurrency_key="k", concurrency_limit=1)
        got = box.receive()
        assert got is not None and got.data == "x"
        assert box.receive() is None
        got.complete()
        after = box.receive()
        assert after is not None and after.data == "y"
        after.complete()
