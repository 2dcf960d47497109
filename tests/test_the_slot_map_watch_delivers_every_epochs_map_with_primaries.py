"""The slot map's watch delivers the map of every epoch (each switch awaited before the
next), each with every registered shard's primary address (its leader's member record),
a registered shard that owns no slot listed with none, and a new map when a shard's
leader changes (rsd/cluster/slotmap.py: ``watch``). A node gives each to its server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from support.etcd import EtcdCluster, stores

from rsd.cluster.slotmap import SlotMapStore
from rsproto.slots import SlotMap

SEEN_WITHIN = 15.0  # seconds for a change to be delivered, generously (a loaded machine)


async def _next(maps: asyncio.Queue[SlotMap]) -> SlotMap:
    return await asyncio.wait_for(maps.get(), SEEN_WITHIN)


async def test_the_watch_delivers_every_epochs_map_with_each_shards_primary(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", "b") as (a, b), \
            stores(cluster.endpoints, "c", shard="s2") as (c,), \
            stores(cluster.endpoints, "w") as (watcher,):
        for node, port in ((a, 7001), (b, 7002), (c, 7101)):
            await node.register(f"127.0.0.1:{port}", "standby")
        assert await a.campaign() == 1
        store = SlotMapStore(a)
        await store.ensure(1024, None)
        seen: asyncio.Queue[SlotMap] = asyncio.Queue()

        async def watch() -> None:
            async for made in SlotMapStore(watcher).watch():
                seen.put_nowait(made)

        task = asyncio.create_task(watch())
        try:
            first = await _next(seen)
            assert first.epoch == 1 and first.ranges == ((0, 1023, "default"),)
            assert dict(first.primaries) == {"default": "127.0.0.1:7001", "s2": None}
            assert [e.ranges for e in first.shards()] == [((0, 1023),), ()]  # s2: none

            assert await c.campaign() == 1
            led = await _next(seen)
            assert led.epoch == 1 and led.primaries["s2"] == "127.0.0.1:7101"

            epoch = led.epoch
            for lo, hi in ((512, 1023), (0, 99), (100, 199)):
                await store.switch(lo, hi, "s2", epoch)
                made = await _next(seen)
                assert made.epoch == epoch + 1, made
                assert all(made.owner(slot) == "s2" for slot in range(lo, hi + 1))
                assert dict(made.primaries) == {"default": "127.0.0.1:7001",
                                                "s2": "127.0.0.1:7101"}
                epoch = made.epoch

            assert await a.step_down() and await b.campaign() == 2  # a takeover
            handed = await _next(seen)  # none between the two, or already b
            if handed.primaries["default"] is None:
                handed = await _next(seen)
            assert handed.epoch == epoch and handed.primaries["default"] == "127.0.0.1:7002"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
