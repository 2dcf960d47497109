"""The synchronous standby's name is written only by the leader: a write guarded, in the
same transaction, by the leader key holding this node's name and being the one its own
campaign made. Another node, a former leader, and a later run of the leader's own name
cannot name it (rsd/cluster/etcd.py: name_sync)."""

from __future__ import annotations

from collections.abc import Callable

from support.etcd import EtcdCluster, stores


async def test_only_the_current_leader_names_the_sync_standby(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", "b", "c") as (a, b, c):
        assert not await a.name_sync("b")  # no leader yet
        assert await a.campaign() == 1

        assert not await b.name_sync("b")
        assert await b.sync() is None
        assert await a.name_sync("b")
        assert await c.sync() == "b"
        assert await a.name_sync(None)
        assert await c.sync() is None
        assert await a.name_sync("c")

        # A later run of "a" (its own lease; the old key has not expired yet).
        async with stores(cluster.endpoints, "a") as (again,):
            assert await again.campaign() is None
            assert not await again.name_sync("a")
        assert await c.sync() == "c"

        # After a takeover the former leader cannot write, the new one can.
        assert await a.step_down()
        assert await b.campaign() == 2
        assert not await a.name_sync("a")
        assert await c.sync() == "c"  # the sync standby outlives the leader that named it
        assert await b.name_sync("a")
        assert await c.sync() == "a"


async def test_naming_the_sync_standby_never_overwrites_a_change_it_did_not_see(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    """A compare-and-swap on the sync key: a write the leader did not see (here made by
    hand; in life, a write of its own whose answer was lost and that was applied late)
    makes its next write fail instead of passing over it; the leader then knows the key
    as it is, and writes again."""
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", "b") as (a, b):
        assert await a.campaign() == 1
        assert await a.name_sync("b")
        client = b.channel()
        await client.put(b._sync_key, b"stale")  # the key moved without the leader
        assert not await a.name_sync("c")
        assert await b.sync() == "stale"
        assert await a.name_sync("c")  # it read the key as it is
        assert await b.sync() == "c"
        assert await a.name_sync(None)
        assert await b.sync() is None
        assert await a.name_sync("b")  # from an absent key
        assert await b.sync() == "b"
