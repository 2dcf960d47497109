"""Two shards in one etcd are two HA groups: each elects its own primary, their epochs
grow independently, and the default shard (today's keys, under ``/rsd/<cluster>/``)
reads nothing of the other shard's keys (under ``/rsd/<cluster>/shards/NAME/``) nor of
the slot map beside them (rsd/cluster/etcd.py: ``shard_prefix``, ``_not_its_own``)."""

from __future__ import annotations

from collections.abc import Callable

from support.etcd import EtcdCluster, stores

from rsd.cluster.slotmap import SlotMapStore


async def test_two_shards_elect_their_primaries_and_count_their_epochs_independently(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", "b") as (a, b), \
            stores(cluster.endpoints, "c", "d", shard="s2") as (c, d):
        assert a.prefix == b"/rsd/test/"  # the default shard's keys are today's
        assert c.prefix == b"/rsd/test/shards/s2/"
        await a.register("127.0.0.1:7001", "standby")
        await b.register("127.0.0.1:7002", "standby")
        before = await a.view()

        await c.register("127.0.0.1:7101", "standby")
        await d.register("127.0.0.1:7102", "standby")
        assert await c.campaign() == 1  # the other shard's leader does not stop this one
        assert await a.campaign() == 1
        assert await b.campaign() is None and await d.campaign() is None
        assert await a.leader() == ("a", 1)
        assert await d.leader() == ("c", 1)

        for _ in range(3):  # s2's takeovers move s2's epoch only
            assert await c.step_down()
            assert await d.campaign() is not None
            c, d = d, c
        assert await c.leader() == (c.node, 4)
        assert await a.leader() == ("a", 1)
        assert await c.name_sync(d.node)
        assert await b.sync() is None and await d.sync() == d.node

        await SlotMapStore(c).ensure(1024, "s2")  # the map, under the default's prefix
        view = await a.view()
        assert set(view.members) == {"a", "b"}
        assert (view.epoch, view.leader, view.sync, view.last_leader) == (1, "a", None, "a")
        assert view.members == before.members
        assert {m["name"] for m in await d.members()} == {"c", "d"}
