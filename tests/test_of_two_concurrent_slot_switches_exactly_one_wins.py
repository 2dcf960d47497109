"""Of two switches of the slot map asked from the same epoch at once, exactly one wins
and the map moves one epoch; the other is refused (``MapMoved``) and changes nothing, as
is a switch asked from an epoch the map has left (rsd/cluster/slotmap.py: ``switch`` is
one transaction comparing the key's mod revision with the one it read)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support.etcd import EtcdCluster, stores

from rsd.cluster.slotmap import MapMoved, SlotMapStore

ROUNDS = 5


async def test_of_two_concurrent_switches_from_one_epoch_exactly_one_wins(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a") as (a,), \
            stores(cluster.endpoints, "b", shard="s2") as (b,):
        await a.register("127.0.0.1:7001", "primary")
        await b.register("127.0.0.1:7002", "primary")
        maps = SlotMapStore(a), SlotMapStore(b)
        current = await maps[0].ensure(1024, None)
        for _ in range(ROUNDS):
            epoch = current.epoch
            results = await asyncio.gather(
                maps[0].switch(0, 99, "s2", epoch), maps[1].switch(100, 199, "s2", epoch),
                return_exceptions=True)
            won = [r for r in results if not isinstance(r, BaseException)]
            lost = [r for r in results if isinstance(r, BaseException)]
            assert len(won) == 1 and len(lost) == 1, results
            assert isinstance(lost[0], MapMoved), lost
            stored = await maps[0].current()
            assert stored is not None
            assert stored.epoch == epoch + 1 and stored.ranges == won[0].ranges
            with pytest.raises(MapMoved):  # from an epoch the map has left
                await maps[1].switch(500, 599, "s2", epoch)
            # back to the default shard for the next round
            current = await maps[0].switch(0, 199, "default", epoch + 1)
            assert current.ranges == ((0, 1023, "default"),)
