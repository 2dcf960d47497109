"""The HTTP listener on the nodes of a cluster: the primary's /api/overview carries the
cluster as it sees it (members, roles, lag); a standby serves /metrics (its own series)
and answers /api/ with 503 NOT_PRIMARY, the cluster status beside it in the overview's
place: no core of a standby is ever read or changed through the dashboard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from support.cluster import kill_all, primary, start_all
from support.etcd import EtcdCluster
from support.http import http
from support.process import Rsd


async def test_the_primary_shows_its_cluster_and_a_standby_refuses_the_api(
    rsds: Callable[..., Rsd], etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(1)
    nodes = [rsds(f"n{i}") for i in range(2)]
    try:
        await start_all(etcd, nodes, "--http-listen", "127.0.0.1:0")
        leader, client, _ = await primary(nodes)
        await client.close()
        standby = next(node for node in nodes if node is not leader)
        port = leader.metrics_port()
        members: list[dict[str, object]] = []
        for _ in range(150):  # the standby joins, then catches up
            status, overview = await http(port, "GET", "/api/overview")
            assert status == 200
            members = overview["cluster"]["members"]
            if sorted(str(m["role"]) for m in members) == ["primary", "standby"]:
                break
            await asyncio.sleep(0.1)
        assert sorted(str(m["role"]) for m in members) == ["primary", "standby"]
        assert overview["stats"]["cluster"]["cluster"] == overview["cluster"]["cluster"]

        status, refused = await http(standby.metrics_port(), "GET", "/api/runs")
        assert status == 503 and refused["error"] == "NOT_PRIMARY"
        status, text = await http(standby.metrics_port(), "GET", "/metrics")
        assert status == 200 and "rsd_" in text
    finally:
        await kill_all(nodes)
