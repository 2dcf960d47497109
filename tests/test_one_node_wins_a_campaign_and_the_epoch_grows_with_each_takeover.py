"""Of the nodes campaigning at once, exactly one becomes leader, and each takeover comes
with an epoch one greater than the last: after a step down, and after the leader died and
its lease ran out (rsd/cluster/etcd.py: campaign is one transaction)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from support.aio import now
from support.etcd import EtcdCluster, stores

ROUNDS = 4


async def test_of_nodes_campaigning_at_once_exactly_one_wins_each_time_with_the_next_epoch(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=3)
    async with stores(cluster.endpoints, "a", "b", "c") as nodes:
        for epoch in range(1, ROUNDS + 1):
            results = await asyncio.gather(*(node.campaign() for node in nodes))
            winners = [node for node, won in zip(nodes, results, strict=True) if won]
            assert len(winners) == 1, results
            assert max(results, key=lambda won: won or 0) == epoch
            assert await nodes[0].leader() == (winners[0].node, epoch)
            others = [node for node in nodes if node is not winners[0]]
            assert await others[0].campaign() is None  # a leader holds the key
            assert await others[0].leader() == (winners[0].node, epoch)
            assert await winners[0].step_down()


async def test_a_dead_leaders_key_goes_with_its_lease_and_the_next_leader_has_a_new_epoch(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "b", lease_seconds=2) as (standby,):
        async with stores(cluster.endpoints, "a", lease_seconds=2) as (leader,):
            assert await leader.campaign() == 1
            assert await standby.campaign() is None
        # "a" is closed without resigning, as if it died: its lease runs out.
        died = now()
        while (epoch := await standby.campaign()) is None:
            assert now() - died < 10, "the dead leader's key never went"
            await asyncio.sleep(0.05)
        assert epoch == 2
        assert await standby.leader() == ("b", 2)


async def test_a_leader_that_resigns_leaves_at_once(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", "b", lease_seconds=2) as (a, b):
        await a.register("127.0.0.1:7001", "primary")
        assert await a.campaign() == 1
        await a.resign()
        assert a.lease_id is None
        assert await b.leader() == (None, 1)
        assert [m["name"] for m in await b.members()] == []  # the record went with the lease
        assert await b.campaign() == 2
        assert await a.campaign() is None  # no lease: no campaign
        assert not await a.name_sync("a")
        assert await b.sync() is None
