"""A settlement rsd recorded but could not answer (killed between the journal's fsync and
the reply) is sent again by the SDK after the restart, and ``complete()`` returns
normally; the task's result is recorded once.

The kill is the ``journal.after_fsync.kill`` failpoint armed for the fsync that covers
the completion: the delivery is taken first and rsd stopped cleanly (its lease lives on
through a restart), and the fsyncs a start makes by itself are counted on a copy of the
data directory (the server's ``journal.fsyncs``), so the next one is the completion's.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable

import pytest
from support.process import KILLED, SHORT_LEASES, Rsd

from rsclient import AsyncRunstate
from rsclient.errors import UnavailableError


async def fsyncs_of_a_start(rsd: Rsd, copy: Rsd) -> int:
    """How many fsyncs a start of ``rsd``'s data directory makes before any request."""
    shutil.copytree(rsd.data, copy.data)
    address = await copy.start()
    async with AsyncRunstate(holder="count", address=address) as rs:
        stats = await rs.admin.stats()
    await copy.kill()
    fsyncs: int = stats["journal"]["fsyncs"]
    return fsyncs


async def test_a_complete_recorded_just_before_a_kill_returns_after_the_restart(
    rsds: Callable[..., Rsd],
) -> None:
    rsd = rsds("settle")  # restarts keep the port its first start reported
    address = await rsd.start()
    async with AsyncRunstate(holder="worker", address=address) as rs:
        await rs.scopes.create(id="s")
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        ticket = await box.submit({"n": 1}, key="once")
        delivery = await box.receive(lease_seconds=60)
        assert delivery is not None
        assert await rsd.stop() == 0  # clean: the delivery's lease lives through it

        at_start = await fsyncs_of_a_start(rsd, rsds("count"))
        await rsd.start(failpoints=f"journal.after_fsync.kill:{at_start + 1}")
        completing = asyncio.ensure_future(delivery.complete(result={"payload": "done"}))
        assert await rsd.exited(20) == KILLED  # the completion's fsync was reached
        await rsd.start()
        assert await asyncio.wait_for(completing, 20) == []
        assert delivery.state == "SUCCEEDED"
        result = await ticket.result(timeout_ms=5000)
        assert (result["state"], result["outcome"], result["attempt"]) == (
            "SUCCEEDED", "done", 1
        )
    assert "the last stop was not clean" in rsd.log()


SHORT = 3  # seconds: the SDK gives the lease up 2 s after the renewal's send (1 s margin)


async def test_a_settlement_is_not_sent_again_past_its_leases_deadline(
    rsds: Callable[..., Rsd],
) -> None:
    """rsd is back only after the lease's deadline: the SDK does not send the settlement
    again (rsd, which recorded it, no longer remembers it and would answer STALE_CLAIM,
    telling the worker its result was refused when it is the task's): ``complete()``
    raises UnavailableError, its outcome unknown, and the task holds the result.

    The delivery's lease is long while rsd restarts (it must still be live when the
    completion is sent), then renewed to ``SHORT`` seconds just before the completion
    (a LEASE_RESIZED record: one fsync more before the completion's), so the deadline
    waited for is a few seconds away, not what is left of the long lease."""
    rsd = rsds("late")
    address = await rsd.start(*SHORT_LEASES)
    async with AsyncRunstate(holder="worker", address=address, connect_timeout=30.0) as rs:
        await rs.scopes.create(id="s")
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        ticket = await box.submit({"n": 1}, key="once")
        delivery = await box.receive(lease_seconds=10)
        assert delivery is not None
        assert await rsd.stop() == 0

        at_start = await fsyncs_of_a_start(rsd, rsds("count"))
        await rsd.start(*SHORT_LEASES, failpoints=f"journal.after_fsync.kill:{at_start + 2}")
        await delivery.lease.renew(SHORT)  # the first fsync after the start
        completing = asyncio.ensure_future(delivery.complete(result={"payload": "done"}))
        assert await rsd.exited(20) == KILLED  # recorded, its reply lost
        # rsd is back a second after the lease's deadline, while the SDK is still
        # trying to reach it (its connect_timeout is longer): the SDK gave up at the
        # deadline rather than send the settlement then.
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, delivery.lease.lost_at + 1.0 - loop.time()))
        await rsd.start(*SHORT_LEASES)
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(completing, 40)
        result = await ticket.result(timeout_ms=5000)
        assert (result["state"], result["outcome"]) == ("SUCCEEDED", "done")
