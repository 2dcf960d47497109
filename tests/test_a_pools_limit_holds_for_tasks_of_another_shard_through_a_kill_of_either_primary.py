"""A pool's limit holds for tasks of another shard that need it, through a kill -9 of the
primary of either shard, and nothing is lost (rsd/core/work/grants.py,
rsd/wire/remoteneeds.py).

Shard ``a`` is the home of pool ``gpu`` (size 2); shard ``b`` owns half the slots and the
run whose tasks need the pool. The shard whose primary is killed has a primary and its
synchronous standby (``--fsync always``, a 2 s cluster lease), the other one node.
Workers consume the tasks while that primary is killed (SIGKILL), its standby takes
over and the killed node comes back as the standby:
- the pool's shard killed: b's primary renews its grants on the new primary of ``a``
  (they were replicated with their hold tasks) and sends its unanswered asks again
  (the same hold keys);
- the tasks' shard killed: the new primary holds the grants the old one journaled
  (replicated with the tasks' deliveries) and renews them on ``a``, and asks again, under
  the same keys, for the tasks it meets waiting (a grant its old primary took but did not
  journal lapses on ``a`` and is asked for under the next number).

Either way:
- from the recorded history of every handler's entry and exit: never more than 2 at
  once, before, during and after the takeover;
- every task submitted succeeds (none lost, none stuck waiting for a grant), some of
  them after the kill;
- the pool is free at the end.

Every node lowers the shortest lease (``SHORT_LEASES``), and with it a grant's lease to
three cluster leases (6 s, not 10: rsd/wire/remoteneeds.py, ``RemoteNeeds.lease``), which
still outlives a takeover of either shard: a grant lost with a killed primary lapses
sooner, and the tasks it held wait less for it. Both cases share one etcd member
(``shared_etcd``), each its own cluster name on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster import kill_all, primary, sync_named
from support.etcd import EtcdCluster
from support.process import SHORT_LEASES, Rsd
from support.shards import move, placement_in
from support.shards import shard_args as cluster_args

from rsclient import AsyncRunstate
from rsproto.slots import SlotMap

SIZE = 2
TASKS = 40
# Seconds a handler holds its grant: the 6 workers' slots overlap on a pool of 2 all the
# same, and the 36 or so tasks left after the kill (2 at a time) take 1 s, not 2.
HANDLING = 0.05


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member for both cases (each a cluster of its own name on it): the
    second is spared a start."""
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd"), 1).start()
    try:
        yield etcd
    finally:
        etcd.stop()


def shard_args(etcd: EtcdCluster, cluster: str, shard: str, name: str | None = None,
               fsync: str = "always") -> list[str]:
    """support/shards.py's flags of a node, with the shortest lease lowered."""
    return [*cluster_args(etcd, shard, name, cluster=cluster, fsync=fsync), *SHORT_LEASES]


async def _started(etcd: EtcdCluster, cluster: str, ha: str, pair: list[Rsd],
                   alone: Rsd) -> None:
    """Shard ``ha`` on ``pair`` (nodes n0 and n1: support/cluster.sync_named's names), the
    other shard on ``alone``; a's first node makes the map (every slot a's)."""
    other = "b" if ha == "a" else "a"
    if ha == "a":
        await pair[0].start(*shard_args(etcd, cluster, "a", "n0"))
        await asyncio.gather(pair[1].start(*shard_args(etcd, cluster, "a", "n1")),
                             alone.start(*shard_args(etcd, cluster, other, fsync="no")))
    else:
        await alone.start(*shard_args(etcd, cluster, other, fsync="no"))
        await asyncio.gather(pair[0].start(*shard_args(etcd, cluster, ha, "n0")),
                             pair[1].start(*shard_args(etcd, cluster, ha, "n1")))


@pytest.mark.parametrize("ha", ["a", "b"], ids=["the pools shard", "the tasks shard"])
async def test_a_pools_limit_holds_for_tasks_of_another_shard_through_a_kill_of_either_primary(
    tmp_path: Path, shared_etcd: EtcdCluster, ha: str,
) -> None:
    etcd, cluster = shared_etcd, f"pools-{ha}"
    other = "b" if ha == "a" else "a"
    pair = [Rsd(tmp_path / f"{ha}0"), Rsd(tmp_path / f"{ha}1")]
    alone = Rsd(tmp_path / f"{other}0")
    history: list[tuple[str, Any, float]] = []  # ("in" | "out", task data, loop time)
    try:
        await _started(etcd, cluster, ha, pair, alone)
        first, probe, epoch = await primary(pair)
        await probe.close()
        _, probe, _ = await primary([alone])
        await probe.close()
        owned: SlotMap = await move({ha: first.address, other: alone.address}, 512, 1023, "b")
        await sync_named(first, pair)
        gpu = f"{{{placement_in(owned, 'a')}}}gpu"
        addresses = ",".join(node.address for node in (*pair, alone))
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
                    await asyncio.sleep(HANDLING)
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
                _, probe, _ = await primary(pair, after=epoch)
                await probe.close()
                again = pair.index(first)
                await first.start(*shard_args(etcd, cluster, ha, f"n{again}"))
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
        if ha == "a":
            assert "connecting again" in alone.log()  # b's link to a went through the kill
    finally:
        await kill_all([*pair, alone])
    inside, most = 0, 0
    for event, _, _ in history:
        inside += 1 if event == "in" else -1
        most = max(most, inside)
    assert most <= SIZE, history
    print(f"{len(history) // 2} handler runs of {TASKS} tasks, at most {most} at once")
