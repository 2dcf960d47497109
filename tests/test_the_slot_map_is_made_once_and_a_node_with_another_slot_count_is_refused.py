"""The slot map is made once, by the first node of any shard (every slot to its shard,
epoch 1); a node that comes later finds it as it is, and a node started with another
slot count is told the cluster's and its own (rsd/cluster/slotmap.py: ``ensure``). A
node of a cluster whose map has another slot count than its own exits 78 (EX_CONFIG)
before it leads or serves anything, saying both counts (rsd/clustermode.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import CLUSTER, kill_all
from support.etcd import EtcdCluster, stores
from support.process import Rsd

from rsd.cluster.slotmap import SlotCountMismatch, SlotMapStore
from rsproto.slots import DEFAULT_SLOTS, SlotMap

EXIT_WITHIN = 30.0  # seconds for the refused node to be gone, generously (a loaded machine)


async def test_the_first_node_makes_the_map_and_the_others_find_it_unchanged(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", shard="s1") as (a,), \
            stores(cluster.endpoints, "b") as (b,):
        made = await asyncio.gather(SlotMapStore(a).ensure(1024, "s1"),
                                    SlotMapStore(b).ensure(1024, None))
        assert made[0].ranges == made[1].ranges  # one of the two made it, once
        assert made[0].epoch == 1 and made[0].slots == 1024
        owner = made[0].ranges[0][2]
        assert made[0].ranges == ((0, 1023, owner),)
        again = await SlotMapStore(b).ensure(1024, None)
        assert again.ranges == made[0].ranges and again.epoch == 1

        with pytest.raises(SlotCountMismatch) as refused:
            await SlotMapStore(b).ensure(512, None)
        assert "has 1024 slots" in str(refused.value)
        assert "--slots 512" in str(refused.value)


async def test_a_node_whose_slot_count_is_not_the_clusters_exits_78_saying_why(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    other = DEFAULT_SLOTS // 2
    async with stores(cluster.endpoints, "maker", cluster=CLUSTER) as (maker,):
        await SlotMapStore(maker).ensure(other, None)  # made by a node of another count
    node = Rsd(tmp_path / "n0")
    await node.start("--etcd", cluster.endpoints[0], "--cluster", CLUSTER, "--node", "n0",
                     "--cluster-lease-seconds", "2")
    try:
        assert await node.exited(EXIT_WITHIN) == 78, node.log()
    finally:
        await kill_all([node])
    assert not node.tracebacks()
    assert f"has {other} slots" in node.log()
    assert f"--slots {DEFAULT_SLOTS}" in node.log()
    assert "is the primary" not in node.log()
    async with stores(cluster.endpoints, "reader", cluster=CLUSTER) as (reader,):
        assert await SlotMapStore(reader).current() == SlotMap.whole(
            "default", other, 1, None)  # untouched, and the node led nothing
        assert (await reader.view()).leader is None
