"""A pool's limit holds for tasks that need it through a kill -9 of the primary of the
tasks' shard (not the pool's), and nothing is lost (rsd/core/work/grants.py,
rsd/wire/remoteneeds.py).

Shard ``a`` (one node) is the home of pool ``gpu`` (size 2); shard ``b`` (a primary and
its synchronous standby, ``--fsync always``, a 2 s cluster lease) owns half the slots
and the run whose tasks need the pool. Workers consume them while b's primary is killed
(SIGKILL), its standby takes over and the killed node comes back as the standby: the new
primary holds the grants the old one journaled (replicated with the tasks' deliveries)
and renews them on ``a``, and asks again, under the same keys, for the tasks it meets
waiting (a grant its old primary took but did not journal lapses on ``a`` and is asked
for under the next number).

- from the recorded history of every handler's entry and exit: never more than 2 at
  once, before, during and after the takeover;
- every task submitted succeeds (none lost, none stuck waiting for a grant), some of
  them after the kill;
- the pool is free at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.cluster import kill_all, primary, sync_named
from support.etcd import EtcdCluster
from support.process import Rsd
from support.shards import move, placement_in, shard_args

from rsclient import AsyncRunstate
from rsproto.slots import SlotMap

SIZE = 2
TASKS = 40


async def test_a_pools_limit_holds_for_tasks_needing_it_through_their_primarys_kill(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(1)  # shard b's nodes n0 and n1 (support/cluster.sync_named's names)
    a0, b0, b1 = Rsd(tmp_path / "a0"), Rsd(tmp_path / "b0"), Rsd(tmp_path / "b1")
    history: list[tuple[str, Any, float]] = []  # ("in" | "out", task data, loop time)
    try:
        await a0.start(*shard_args(etcd, "a", fsync="no"))  # makes the map: every slot a's
        await asyncio.gather(b0.start(*shard_args(etcd, "b", "n0")),
                             b1.start(*shard_args(etcd, "b", "n1")))
        _, probe, _ = await primary([a0])
        await probe.close()
        first, probe, epoch = await primary([b0, b1])
        await probe.close()
        owned: SlotMap = await move({"a": a0.address, "b": first.address}, 512, 1023, "b")
        await sync_named(first, [b0, b1])
        gpu = f"{{{placement_in(owned, 'a')}}}gpu"
        addresses = ",".join(node.address for node in (a0, b0, b1))
        async with AsyncRunstate(holder="app", address=addresses) as rs:
            await rs.pools.ensure(gpu, size=SIZE)
            await rs.mailboxes.ensure("jobs")
            run = await rs.scopes.create(placement=placement_in(owned, "b"))
            tickets = [await run.mailbox("jobs").submit(n, key=f"t{n}", needs={"pools": [gpu]})
                       for n in range(TASKS)]
            loop = asyncio.get_running_loop()

            async def handler(data: Any, delivery: object) -> None:
                history.append(("in", data, loop.time()))
                try:
                    await asyncio.sleep(0.1)
                finally:
                    history.append(("out", data, loop.time()))

            stop = asyncio.Event()
            workers = [asyncio.create_task(run.mailbox("jobs").consume(
                handler, concurrency=2, lease_seconds=10, stop_event=stop)) for _ in range(3)]
            try:
                deadline = loop.time() + 30
                while sum(1 for event, _, _ in history if event == "out") < 4:
                    assert loop.time() < deadline, "no task ran before the kill"
                    await asyncio.sleep(0.02)
                killed_at = loop.time()
                await first.kill()
                _, probe, _ = await primary([b0, b1], after=epoch)
                await probe.close()
                again = b0 if first is b0 else b1
                await again.start(*shard_args(etcd, "b", "n0" if again is b0 else "n1"))
                results = [await ticket.result(timeout_ms=90_000) for ticket in tickets]
            finally:
                stop.set()
                await asyncio.gather(*workers)
            assert [view["state"] for view in results] == ["SUCCEEDED"] * TASKS
            ran = {data for event, data, _ in history if event == "in"}
            assert ran == set(range(TASKS))
            assert any(at > killed_at for event, _, at in history if event == "in")
            for _ in range(200):  # the last grants are released once their deliveries end
                if (await rs.pools.inspect(gpu))["held"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await rs.pools.inspect(gpu))["held"] == 0
    finally:
        await kill_all([a0, b0, b1])
    inside, most = 0, 0
    for event, _, _ in history:
        inside += 1 if event == "in" else -1
        most = max(most, inside)
    assert most <= SIZE, history
    print(f"{len(history) // 2} handler runs of {TASKS} tasks, at most {most} at once")
