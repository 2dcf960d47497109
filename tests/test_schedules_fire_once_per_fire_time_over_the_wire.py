"""Schedules over the wire, through the Python SDKs (async and sync): each fire is one
task keyed ``schedule:<name>:<fire time>``, delivered like any task; across a kill -9 and
a restart no fire time is doubled, and with ``catch_up="all"`` none is skipped; the
SDK's errors name what is wrong; another tenant's client does not see them.

Nothing here asserts a duration: fires are waited for by receive, and the checks are
on the keys (which fire times, how many times each).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from rsclient import AsyncRunstate, InvalidArgumentError, NotFoundError
from rsclient.sync import Runstate

# Each test works in runs of its own (and mailboxes it ensures itself), so they share one
# rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


def fire_time(key: str) -> float:
    return datetime.strptime(key.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC).timestamp()


async def take_fires(run: Any, mailbox: str, count: int) -> list[str]:
    """Receive and complete ``count`` deliveries of the mailbox; their task keys."""
    keys: list[str] = []
    box = run.mailbox(mailbox)
    while len(keys) < count:
        delivery = await box.receive(wait=True, timeout_ms=20_000)
        assert delivery is not None, "no fire within 20 s"
        keys.append(delivery.key)
        await delivery.complete(None)
    return keys


async def test_each_fire_is_one_task_keyed_by_its_fire_time(clients: Any) -> None:
    rs: AsyncRunstate = clients("sched")
    await rs.mailboxes.ensure("ticks")
    run = await rs.scopes.create()
    made = await run.schedules.ensure("tick", mailbox="ticks", every_seconds=1,
                                      data={"report": "daily"})
    assert made["created"] is True and made["next_fire"] is not None
    keys = await take_fires(run, "ticks", 3)
    times = [fire_time(k) for k in keys]
    assert all(k.startswith("schedule:tick:") for k in keys)
    assert times == sorted(set(times)) and all(t == int(t) for t in times)
    got = await run.schedules.get("tick", next=3)
    assert got["fires"] >= 3 and len(got["next_fires"]) == 3
    assert [s["name"] for s in await run.schedules.list()] == ["tick"]
    again = await run.schedules.ensure("tick", mailbox="ticks", every_seconds=1,
                                       data={"report": "daily"})
    assert again["created"] is False


async def test_pause_resume_and_delete_over_the_wire(clients: Any) -> None:
    rs: AsyncRunstate = clients("sched-pause")
    await rs.mailboxes.ensure("paused")
    run = await rs.scopes.create()
    await run.schedules.ensure("p", mailbox="paused", cron="0 0 1 1 *", timezone="UTC")
    paused = await run.schedules.pause("p")
    assert paused["paused"] is True and paused["next_fire"] is None
    assert (await run.schedules.get("p"))["next_fires"] == []
    resumed = await run.schedules.resume("p")
    assert resumed["paused"] is False
    assert datetime.fromtimestamp(resumed["next_fire"], UTC).strftime("%m-%d %H:%M") == \
        "01-01 00:00"
    assert await run.schedules.delete("p") is True
    with pytest.raises(NotFoundError):
        await run.schedules.get("p")


@pytest.mark.parametrize(("args", "says"), [
    ({"every_seconds": 5, "cron": "* * * * *"}, "exactly one"),
    ({}, "exactly one"),
    ({"cron": "nope"}, "not a cron expression"),
    ({"cron": "* * * * *", "timezone": "Nowhere/Land"}, "time zone"),
    ({"every_seconds": 5, "catch_up": "sometimes"}, "catch_up"),
])
async def test_bad_schedules_are_refused_naming_what_is_wrong(
    clients: Any, args: dict[str, Any], says: str
) -> None:
    rs: AsyncRunstate = clients("sched-bad")
    await rs.mailboxes.ensure("bad")
    run = await rs.scopes.create()
    with pytest.raises(InvalidArgumentError, match=says):
        await run.schedules.ensure("b", mailbox="bad", **args)


async def test_a_kill_and_restart_neither_doubles_nor_skips_a_fire(
    restartable: Any,
) -> None:
    async with AsyncRunstate(holder="sched-kill", address=restartable.address) as rs:
        await rs.mailboxes.ensure("kill")
        run = await rs.scopes.create()
        await run.schedules.ensure("k", mailbox="kill", every_seconds=1, catch_up="all")
        # One fire taken (its task journaled and completed) before the kill: the span the
        # keys must cover without a double or a gap begins there (the fires' spacing
        # itself is test_each_fire_is_one_task_keyed_by_its_fire_time's).
        before = await take_fires(run, "kill", 1)
    await restartable.kill()
    # A fire time passes while rsd is down: past the next whole second.
    await asyncio.sleep(math.ceil(time.time()) - time.time() + 0.1)
    await restartable.start()
    restarted_at = time.time()
    async with AsyncRunstate(holder="sched-kill", address=restartable.address) as rs:
        run = rs.scope(run.id)
        after: list[str] = []
        # Every fire time missed while down (caught up), then one that came after the
        # restart: the whole span of the kill is covered.
        while not after or fire_time(after[-1]) < restarted_at:
            after += await take_fires(run, "kill", 1)
        keys = before + after
        assert max(Counter(keys).values()) == 1, "a fire time fired twice"
        times = sorted(fire_time(k) for k in keys)
        assert times == [times[0] + i for i in range(len(times))], "a fire time was skipped"


def test_the_sync_client_has_the_same_schedules(rsd: Any) -> None:
    with Runstate(holder="sched-sync", address=rsd.address) as rs:
        rs.mailboxes.ensure("sync-ticks")
        run = rs.scopes.create()
        made = run.schedules.ensure("s", mailbox="sync-ticks", every_seconds=60)
        assert made["created"] is True
        assert run.schedules.get("s")["next_fires"][1] - made["next_fire"] == 60
        assert run.schedules.pause("s")["paused"] is True
        assert run.schedules.resume("s")["paused"] is False
        assert [s["name"] for s in run.schedules.list()] == ["s"]
        assert run.schedules.delete("s") is True
        assert run.schedules.list() == []
