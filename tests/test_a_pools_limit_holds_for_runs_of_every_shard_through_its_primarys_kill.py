"""A pool's limit holds for runs of every shard through a kill -9 of the primary of the
pool's shard (rsd/core/holds/poolbook.py, "Runs of any shard").

Shard ``a`` (a primary and its synchronous standby, ``--fsync always``, a 2 s cluster
lease) is the home of pool ``gpu`` (size 2); shard ``b`` (one node) owns half the slots.
Runs of both shards loop on the guide's ``run.pool(gpu).run(fn, wait=True)`` while a's
primary is killed (SIGKILL), its standby takes over and the killed node comes back as
the standby:

- from the recorded history of every fn's start and end, never more than 2 at once,
  before, during and after the takeover, and runs of both shards held the pool after it
  (the slots granted to runs of ``b`` were replicated with their run ids and renewed on
  the new primary);
- the new primary of ``a`` holds no run of ``b``: a slot's replayed grant makes no run
  on the pool's shard (the standby replays without knowing the map).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from support.cluster import kill_all, primary, sync_named
from support.etcd import EtcdCluster
from support.process import Rsd
from support.raw import raw_connect
from support.shards import move, placement_in, shard_args

from rsclient import AsyncRunstate, LeaseLostError, UnavailableError, WaitTimeoutError
from rsclient.client import Scope
from rsproto import Op
from rsproto.slots import SlotMap, slot_of

SLOTS = 1024
SIZE = 2


async def runs_of(address: str) -> set[str]:
    """The runs a primary holds (ADMIN_SCOPES, first page)."""
    conn = await raw_connect(address)
    try:
        await conn.hello("check")
        reply = await conn.ok(Op.ADMIN_SCOPES, {"limit": 1000})
        return {row["scope"] for row in reply["scopes"]}
    finally:
        conn.close()


async def test_a_pools_limit_holds_for_runs_of_every_shard_through_its_primarys_kill(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(1)  # shard a's nodes n0 and n1 (support/cluster.sync_named's names)
    a0, a1, b0 = Rsd(tmp_path / "a0"), Rsd(tmp_path / "a1"), Rsd(tmp_path / "b0")
    history: list[tuple[str, str, float]] = []  # ("in" | "out", run, loop time)
    stop = asyncio.Event()
    try:
        await a0.start(*shard_args(etcd, "a", "n0"))  # makes the map: every slot a's
        await asyncio.gather(a1.start(*shard_args(etcd, "a", "n1")),
                             b0.start(*shard_args(etcd, "b", fsync="no")))
        first, probe, epoch = await primary([a0, a1])
        await probe.close()
        _, probe, _ = await primary([b0])
        await probe.close()
        owned: SlotMap = await move({"a": first.address, "b": b0.address}, 512, 1023, "b")
        await sync_named(first, [a0, a1])
        gpu = f"{{{placement_in(owned, 'a')}}}gpu"
        addresses = ",".join(node.address for node in (a0, a1, b0))
        async with AsyncRunstate(holder="app", address=addresses) as rs:
            await rs.pools.ensure(gpu, size=SIZE)
            runs = [await rs.scopes.create(placement=placement_in(owned, shard))
                    for shard in ("a", "a", "b", "b", "b")]
            loop = asyncio.get_running_loop()

            async def use(run: Scope) -> None:
                async def fn(lease: object) -> None:
                    history.append(("in", run.id, loop.time()))
                    try:
                        await asyncio.sleep(0.03)
                    finally:
                        history.append(("out", run.id, loop.time()))
                while not stop.is_set():
                    try:
                        await run.pool(gpu, lease_seconds=5).run(fn, wait=True,
                                                                 timeout_ms=20_000)
                    except (LeaseLostError, UnavailableError, WaitTimeoutError):
                        await asyncio.sleep(0.05)  # the takeover: try again

            async def both_held_since(since: float) -> None:
                """Until runs of both shards have held the pool since ``since``."""
                deadline = loop.time() + 30
                while not {owned.owner(slot_of(run, SLOTS)) for event, run, at in history
                           if event == "in" and at > since} >= {"a", "b"}:
                    assert loop.time() < deadline, "runs of both shards did not hold it"
                    await asyncio.sleep(0.05)

            users = [asyncio.create_task(use(run)) for run in runs]
            await both_held_since(0.0)  # before the kill (no fixed sleep)
            killed_at = loop.time()
            await first.kill()
            second, probe, _ = await primary([a0, a1], after=epoch)
            await probe.close()
            again = a0 if first is a0 else a1
            await again.start(*shard_args(etcd, "a", "n0" if again is a0 else "n1"))
            await both_held_since(killed_at)  # after it
            stop.set()
            await asyncio.gather(*users)
            far = {run.id for run in runs if owned.owner(slot_of(run.id, SLOTS)) == "b"}
            assert not far & await runs_of(second.address)
    finally:
        stop.set()
        await kill_all([a0, a1, b0])
    inside, most = 0, 0
    for event, _, _ in history:
        inside += 1 if event == "in" else -1
        most = max(most, inside)
    assert most <= SIZE, history
    print(f"{sum(1 for event, _, _ in history if event == 'in')} holds, at most {most} at once")
