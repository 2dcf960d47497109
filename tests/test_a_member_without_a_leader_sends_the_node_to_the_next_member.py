"""A node whose etcd member answers but cannot serve (cut off from its cluster: "no
leader", or calls that time out) moves its channel to the next member instead of staying
on it: every node lists the members in the same order, and one member cut off would
otherwise hold them all (rsd/cluster/client.py: Link). Here the first endpoint is a
member whose two peers get paused, and the next one is a healthy single-member cluster's
(so where a node's calls went shows in what it reads)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from support.aio import now
from support.etcd import EtcdCluster, stores

from rsd.cluster.client import EtcdError
from rsd.cluster.etcd import EtcdStore

WITHIN = 10.0
T = TypeVar("T")


async def _answered(call: Callable[[], Awaitable[T]]) -> T:
    """What ``call`` returns once etcd answers it (errors until then are expected)."""
    deadline = now() + WITHIN
    while True:
        try:
            return await call()
        except EtcdError:
            assert now() < deadline, "no member ever answered"
            await asyncio.sleep(0.05)


async def test_a_node_leaves_a_member_that_has_lost_its_leader(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cut_off = etcd_cluster(size=3)
    healthy = etcd_cluster(size=1)
    endpoints = [cut_off.endpoints[0], healthy.endpoints[0]]
    async with stores(endpoints, "a") as (a,):
        assert await a.campaign() == 1  # on the first member, while its cluster is whole
        cut_off.pause(1, 2)
        # Its next calls fail, and it moves on: then it reads the other cluster's keys.
        assert await _answered(a.leader) == (None, 0)
        assert a.channel_moves >= 1

        # A node starting now gets there too.
        b = EtcdStore(endpoints, "test", "b")
        try:
            await _answered(b.connect)
            assert await b.campaign() == 1
            assert b.channel_moves >= 1
        finally:
            await b.close()
