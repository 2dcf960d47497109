"""A node watches two things on its one etcd channel (the cluster's keys: elector.py; the
slot map: slotmap.py), and aetcd makes one watch at a time on a channel: the second
waits for the first's answer before its own request is sent. Each watch is given the
call timeout from when its turn comes (rsd/cluster/etcd.py: ``watching``), so etcd as
far as the manual allows (a round trip up to the call timeout) makes both at once.

Before: the call timeout ran from the call, the second watch's covered two round trips,
and with etcd 0.6 s away each way (tests/test_a_cluster_whose_etcd_is_far_keeps_its_primary.py:
1.2 s round trips, a 1.42 s call timeout) every node's second watch broke at start ("etcd
did not answer a watch within 1.42 s") and was made again later: a standby learned the
leader's address seconds late. Here the same, scaled down for time: round trips of 0.5 s
and a call timeout of 0.9 s (one round trip fits with 0.4 s to spare for a loaded
machine, two do not, whatever the load). Real etcd behind a proxy that delays every byte
(support/proxy.py), as the far test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from support.etcd import EtcdCluster
from support.proxy import Proxy

from rsd.cluster.etcd import ClusterView, EtcdStore

FAR = 0.25  # seconds each way
CALL_TIMEOUT = 0.9  # seconds: one round trip fits, two do not
WATCHES = 2


async def test_two_watches_made_at_once_over_a_far_etcd_are_both_made_without_a_break(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    assert 2 * FAR < CALL_TIMEOUT < 4 * FAR
    etcd = etcd_cluster(1)
    proxy = await Proxy("127.0.0.1", etcd.members[0].client_port, delay=FAR).start()
    store = EtcdStore([proxy.address], "far", "a", call_timeout=CALL_TIMEOUT)
    seen: list[asyncio.Queue[ClusterView]] = [asyncio.Queue() for _ in range(WATCHES)]

    async def watch(views: asyncio.Queue[ClusterView]) -> None:
        async for view in store.watching(store.prefix, store.view, lambda name: True):
            views.put_nowait(view)

    watching: list[asyncio.Task[None]] = []
    try:
        await store.connect()
        watching = [asyncio.create_task(watch(views)) for views in seen]
        for views in seen:  # each read its view, then asked for its watch
            assert (await asyncio.wait_for(views.get(), 30)).leader is None
        assert await store.campaign() == 1  # a change each watch must see
        for views in seen:
            view = await asyncio.wait_for(views.get(), 30)
            assert (view.leader, view.epoch) == ("a", 1)
        assert store.watch_breaks == 0  # seen on the watch asked for first, not on a new one
    finally:
        for task in watching:
            task.cancel()
        await asyncio.gather(*watching, return_exceptions=True)
        await store.close()
        await proxy.close()
