"""The watch of the cluster's keys outlives the etcd member it was on: killed (its
connection reset) or hung (SIGSTOP, found by the channel's 1 s pings), the watch is made
again on another member from a fresh read, and the next change of leader is seen
(rsd/cluster/etcd.py: watch; rsd/cluster/client.py: the channel)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from support.aio import now
from support.etcd import EtcdCluster, stores

from rsd.cluster.client import EtcdError
from rsd.cluster.etcd import ClusterView, EtcdStore

SEEN_WITHIN = 10.0  # seconds: a ping timeout, a reconnection and a read, generously


async def _succeeds(call: Callable[[], Awaitable[int | bool | None]]) -> None:
    """Call until etcd answers yes (a channel may fail once on its way to another member)."""
    deadline = now() + SEEN_WITHIN
    while True:
        try:
            if await call():
                return
        except EtcdError:
            pass
        assert now() < deadline, "etcd never answered yes"
        await asyncio.sleep(0.05)


async def _stepped_down(store: EtcdStore) -> bool:
    """Step down; whether there is no leader now (a step down whose answer was lost may
    have been done all the same)."""
    with contextlib.suppress(EtcdError):
        await store.step_down()
    return (await store.leader())[0] is None


async def _next(views: asyncio.Queue[ClusterView], leader: str | None, epoch: int) -> None:
    while True:
        view = await asyncio.wait_for(views.get(), SEEN_WITHIN)
        if (view.leader, view.epoch) == (leader, epoch):
            return


async def test_a_leader_change_is_seen_after_the_watched_member_is_killed_or_hangs(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=3)
    async with stores(cluster.endpoints, "w", "x", "y") as (watcher, x, y):
        views: asyncio.Queue[ClusterView] = asyncio.Queue()

        async def watch(store: EtcdStore) -> None:
            async for view in store.watch():
                views.put_nowait(view)

        watching = asyncio.create_task(watch(watcher))
        try:
            await _next(views, None, 0)
            await _succeeds(x.campaign)
            await _next(views, "x", 1)

            # Every channel is on the first member (pick_first): kill it.
            cluster.kill(0)
            await _succeeds(lambda: _stepped_down(x))
            await _succeeds(y.campaign)
            await _next(views, "y", 2)
            assert watcher.watch_breaks >= 1

            # Back to three members; then the one the watch moved to (the second) hangs.
            await asyncio.to_thread(cluster.restart, 0)
            breaks = watcher.watch_breaks
            cluster.pause(1)
            await _succeeds(lambda: _stepped_down(y))
            await _succeeds(x.campaign)
            await _next(views, "x", 3)
            assert watcher.watch_breaks > breaks
        finally:
            cluster.resume()
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
