"""A grant of another shard's pool that its holder cannot renew in time (the pool's
primary paused, SIGSTOP) ends the delivery it allows before the pool's shard may give
the slot to another (rsd/wire/remoteneeds.py, ``RemoteNeeds._check``): the holder gives
up first, as a lease's holder must.

Shard ``a`` (one node) homes a pool of 2; shard ``b`` (one node) runs tasks needing it.
The first deliveries of tasks 0 and 1 hold their handlers until cancelled; a's primary
is paused for longer than a grant's lease: b ends both deliveries (their handlers are
cancelled with LeaseLostError, the tasks go back to their queue), and once a leads again
(it steps down when it wakes, its leadership lapsed, and is started again) every task
runs to its end, never more than 2 handlers at once.

Both nodes lower the shortest lease (``SHORT_LEASES``), and with it a grant's lease to
three cluster leases (6 s, not 10: rsd/wire/remoteneeds.py, ``RemoteNeeds.lease``): the
order of the lapse and the pool's own deadline is the same, a tenth of a lease apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.cluster import kill_all, primary
from support.etcd import EtcdCluster
from support.process import SHORT_LEASES, Rsd
from support.shards import move, placement_in, shard_args

from rsclient import AsyncRunstate
from rsproto.slots import SlotMap

SIZE = 2
TASKS = 6


async def test_a_grant_not_renewed_in_time_ends_its_delivery_first(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(1)
    a0, b0 = Rsd(tmp_path / "a0"), Rsd(tmp_path / "b0")
    history: list[tuple[str, Any]] = []  # ("in" | "out", task data), in the order it happened
    try:
        await a0.start(*shard_args(etcd, "a", fsync="no"), *SHORT_LEASES)  # makes the map:
        await b0.start(*shard_args(etcd, "b", fsync="no"), *SHORT_LEASES)  # every slot a's
        for node in (a0, b0):
            _, probe, _ = await primary([node])
            await probe.close()
        owned: SlotMap = await move({"a": a0.address, "b": b0.address}, 512, 1023, "b")
        gpu = f"{{{placement_in(owned, 'a')}}}gpu"
        async with AsyncRunstate(holder="app", address=f"{a0.address},{b0.address}") as rs:
            await rs.pools.ensure(gpu, size=SIZE)
            await rs.mailboxes.ensure("jobs")
            run = await rs.scopes.create(placement=placement_in(owned, "b"))
            tickets = [await run.mailbox("jobs").submit(n, key=f"t{n}", needs={"pools": [gpu]})
                       for n in range(TASKS)]
            held: set[Any] = set()
            loop = asyncio.get_running_loop()

            async def handler(data: Any, delivery: object) -> None:
                history.append(("in", data))
                try:
                    first = data in (0, 1) and data not in held
                    held.add(data)
                    await asyncio.sleep(600 if first else 0.05)  # 0 and 1: until cancelled
                finally:
                    history.append(("out", data))

            stop = asyncio.Event()
            worker = asyncio.create_task(run.mailbox("jobs").consume(
                handler, concurrency=4, lease_seconds=60, stop_event=stop))
            try:
                deadline = loop.time() + 30
                while held != {0, 1}:
                    assert loop.time() < deadline, history
                    await asyncio.sleep(0.02)
                a0.pause()
                deadline = loop.time() + 60
                while sum(1 for event, data in history if event == "out" and data in (0, 1)) < 2:
                    assert loop.time() < deadline, history  # the grants lapsed at b: cancelled
                    await asyncio.sleep(0.05)
                a0.resume()  # it finds its leadership lapsed and exits (75) to start again
                await a0.exited(timeout=30)
                await a0.start(*shard_args(etcd, "a", fsync="no"), *SHORT_LEASES)
                results = [await ticket.result(timeout_ms=90_000) for ticket in tickets]
            finally:
                stop.set()
                await worker
            assert [view["state"] for view in results] == ["SUCCEEDED"] * TASKS
            assert "not renewed in time" in b0.log()
    finally:
        await kill_all([a0, b0])
    inside, most = 0, 0
    for event, _ in history:
        inside += 1 if event == "in" else -1
        most = max(most, inside)
    assert most <= SIZE, history
    assert [data for event, data in history if event == "in"].count(0) == 2  # ran again
