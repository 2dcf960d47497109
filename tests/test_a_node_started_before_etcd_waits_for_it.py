"""A node started while etcd cannot be reached waits for it as long as it takes: it
answers on its port (NOT_PRIMARY) from the start, logs that it waits for etcd (again at
each attempt, the pause doubling up to the lease), and joins the cluster once etcd
answers; SIGTERM while it waits stops it cleanly, exit 0 (rsd/clustermode.py:
wait_for_etcd). Before, it exited 1 at once ("cannot reach etcd"), and so did every
restart of a node while etcd was down.

Real etcd, started late behind a proxy (support/proxy.py) whose address the nodes were
given: the test is of gRPC's channel reconnecting to a member that was not there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import CLUSTER, kill_all, primary
from support.etcd import EtcdCluster
from support.process import Rsd, refusing_address
from support.proxy import Proxy

from rsclient import AsyncRunstate, UnavailableError

WAITS = "waits for etcd at"
SEEN_WITHIN = 15.0  # seconds for a log line to come, generously (a loaded machine)


async def _logged(node: Rsd, text: str, times: int = 1) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SEEN_WITHIN
    while node.log().count(text) < times:
        assert node.alive, node.log()
        assert loop.time() < deadline, f"{text!r} not logged {times} times:\n{node.log()}"
        await asyncio.sleep(0.05)


async def test_a_node_started_before_etcd_waits_and_joins_once_etcd_is_up(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    with refusing_address() as nowhere:
        host, port = nowhere.rsplit(":", 1)
        proxy = await Proxy(host, int(port)).start()  # etcd is not there yet
    # etcd starts meanwhile, where the proxy does not lead (the nodes cannot tell it from
    # no etcd at all): its start is not waited for after they have waited.
    started = asyncio.ensure_future(asyncio.to_thread(etcd_cluster, 1))
    try:
        await asyncio.gather(*(node.start(
            "--etcd", proxy.address, "--cluster", CLUSTER, "--node", f"n{i}",
            "--cluster-lease-seconds", "2", "--fsync", "always") for i, node in enumerate(nodes)))
        for node in nodes:
            await _logged(node, WAITS)
        client = AsyncRunstate(holder="early", address=nodes[0].address, connect_timeout=1.0)
        try:
            with pytest.raises(UnavailableError, match="NOT_PRIMARY"):  # answered, and no
                await client.mailboxes.ensure("work", mode="WORK")  # primary known
        finally:
            await client.close()
        for node in nodes:
            await _logged(node, WAITS, times=2)  # and again: it waits, it does not give up

        quitter = nodes.pop()
        assert await quitter.stop() == 0, quitter.log()  # SIGTERM while waiting: clean

        etcd = await started
        proxy.target = ("127.0.0.1", etcd.members[0].client_port)
        _, rs, _ = await primary(nodes, timeout=30)
        await rs.mailboxes.ensure("work", mode="WORK")  # acknowledged: its standby joined too
        ticket = await rs.scope((await rs.scopes.create()).id).mailbox("work").submit({"n": 1})
        assert ticket.id
        await rs.close()
        for node in nodes:
            assert "reached etcd after" in node.log(), node.log()
    finally:
        await kill_all(nodes)
        await proxy.close()
        await asyncio.wait([started])  # (etcd_cluster stops it, once started)
