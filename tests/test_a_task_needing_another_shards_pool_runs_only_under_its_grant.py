"""A task whose ``needs`` name a pool of another shard is delivered only while its shard
holds a grant of that pool's shard (rsd/core/work/grants.py, rsd/wire/remoteneeds.py):
two real one-node shards over one etcd, a pool of 2 on s2, tasks of a run on s1 needing
it, consumed by several workers that could run 6 at once.

From the recorded history of every handler's entry and exit: never more than 2 at once,
and 2 reached; every task succeeds once; the pool is free at the end. A quota of 5 on s2
needed by 8 tasks on s1: 5 run, each spending its amount once, and 3 wait for a grant
(their ``waiting_for`` names the quota) until their run is cancelled, which cancels their
asks on s2. (The core's rules,
one ask per grant, the grant journaled before its delivery, a lapse ending the delivery,
a replay holding the same grants, are tests/test_core_a_task_needing_another_shards_pool_
runs_only_under_its_grant.py's; this test is for what only real shards show: the two
primaries talking, the grants renewed and released over the wire.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.etcd import EtcdCluster
from support.process import Rsd
from support.shards import halves as two_halves
from support.shards import placement_in

from rsclient import AsyncRunstate
from rsproto.slots import SlotMap

TASKS = 12


@pytest.fixture
async def halves(tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
                 ) -> AsyncIterator[tuple[SlotMap, Rsd, Rsd]]:
    """s1 and s2, each one node, each owning half of the slots; the map."""
    async with two_halves(tmp_path, etcd_cluster(size=1), "needs") as found:
        yield found


async def test_a_pool_of_another_shard_limits_the_tasks_that_need_it(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    gpu = f"{{{placement_in(split, 's2')}}}gpu"  # the pool lives on s2
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.pools.ensure(gpu, size=2)
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create(placement=placement_in(split, "s1"))  # on s1
        tickets = [await run.mailbox("jobs").submit(n, key=f"t{n}", needs={"pools": [gpu]})
                   for n in range(TASKS)]
        history: list[tuple[str, Any]] = []  # ("in" | "out", data), in the order it happened

        async def handler(data: Any, delivery: object) -> Any:
            history.append(("in", data))
            await asyncio.sleep(0.05)
            history.append(("out", data))
            return data

        stop = asyncio.Event()
        workers = [asyncio.create_task(run.mailbox("jobs").consume(
            handler, concurrency=2, lease_seconds=10, stop_event=stop)) for _ in range(3)]
        try:
            results = [await ticket.result(timeout_ms=60_000) for ticket in tickets]
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert [view["state"] for view in results] == ["SUCCEEDED"] * TASKS, results[0]
        inside, most = 0, 0
        for event, _ in history:
            inside += 1 if event == "in" else -1
            most = max(most, inside)
        assert most == 2, history  # the limit was reached, and never passed
        assert sorted(data for event, data in history if event == "in") == list(range(TASKS))
        for _ in range(200):  # the last grants are released once their deliveries end
            if (await rs.pools.inspect(gpu))["held"] == 0:
                break
            await asyncio.sleep(0.05)
        assert (await rs.pools.inspect(gpu))["held"] == 0


async def test_a_quota_of_another_shard_is_spent_once_per_task_and_never_overspent(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    calls = f"{{{placement_in(split, 's2')}}}calls"  # the quota lives on s2
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.quotas.ensure(calls, limit=5, per_seconds=3600)
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create(placement=placement_in(split, "s1"))  # on s1
        tickets = [await run.mailbox("jobs").submit(n, key=f"q{n}", needs={"quotas": {calls: 1}})
                   for n in range(8)]
        ran: list[Any] = []

        async def handler(data: Any, delivery: object) -> None:
            ran.append(data)

        stop = asyncio.Event()
        worker = asyncio.create_task(run.mailbox("jobs").consume(
            handler, concurrency=4, lease_seconds=10, stop_event=stop))
        loop = asyncio.get_running_loop()
        try:
            # Five run (a quota spent twice for one would leave fewer than five), and the
            # other three wait for a grant the quota cannot give.
            deadline = loop.time() + 30
            while True:
                views = [await ticket.status() for ticket in tickets]
                states = sorted(view["state"] for view in views)
                if states == ["PENDING"] * 3 + ["SUCCEEDED"] * 5:
                    break
                assert loop.time() < deadline, views
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await worker
        assert sorted(ran) == [n for n, view in enumerate(views) if view["state"] == "SUCCEEDED"]
        assert 0 <= (await rs.quotas.inspect(calls))["level"] < 1  # all five spent, once
        assert all(view["waiting_for"] == {"pools": [], "quotas": {calls: 1}}
                   for view in views if view["state"] == "PENDING")
        # The run's cancellation ends the three; their asks (hold tasks on s2, in the run
        # rsd/wire/remoteneeds.py names) are cancelled there: no capacity is taken for them.
        await run.cancel()
        hold_run = f"{{{calls[1:calls.index('}')]}}}rsd.needs.s1"
        deadline = loop.time() + 30
        while True:
            holds = [row async for row in rs.admin.iter_tasks(hold_run)]
            if sorted(row["state"] for row in holds) == ["CANCELLED"] * 3 + ["SUCCEEDED"] * 5:
                break
            assert loop.time() < deadline, holds
            await asyncio.sleep(0.05)
