"""Slots are given only to a registered shard (one with a live member, or one that owns
slots already): a switch to any other name is refused (``UnknownShard``) and the map
stays as it was (rsd/cluster/slotmap.py: ``switch``). A shard whose members are all
gone may still be given slots back while it owns some."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.etcd import EtcdCluster, stores

from rsd.cluster.slotmap import SlotMapStore, UnknownShard


async def test_a_switch_to_a_shard_with_no_member_and_no_slot_is_refused(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a") as (a,):
        await a.register("127.0.0.1:7001", "primary")
        maps = SlotMapStore(a)
        made = await maps.ensure(1024, None)
        with pytest.raises(UnknownShard, match="'nowhere' is not registered"):
            await maps.switch(0, 9, "nowhere", made.epoch)
        assert await maps.current() == made

        async with stores(cluster.endpoints, "b", shard="s2") as (b,):
            await b.register("127.0.0.1:7002", "standby")
            moved = await maps.switch(0, 9, "s2", made.epoch)  # registered now
            assert moved.ranges == ((0, 9, "s2"), (10, 1023, "default"))
            await b.resign()  # its member record goes with its lease
        listed = await maps.current()
        assert listed is not None and listed.primaries["s2"] is None  # still owns 0-9
        back = await maps.switch(5, 9, "s2", moved.epoch)  # it owns slots: still known
        assert back.epoch == moved.epoch + 1
