"""A primary cut off from every standby, but not from etcd nor from its clients, steps
down once no standby has acknowledged anything for the cluster lease while changes wait
(node.py): it answers nothing more, gives up the leader key and exits 75; the
synchronous standby, which holds every acknowledged change, takes over, and writes go
on there; nothing acknowledged is lost (the history checker, support/history.py).

The cut: each node advertises the address of a proxy of its own (support/proxy.py),
which is what the standbys follow (and clients sent on by a standby); the clients are
given the nodes' own addresses, the primary's first. The primary's proxy cuts its
standbys' streams only (it drops everything either way on them, and keeps their TCP
connections open, as a partition whose TCP has not given up yet): the primary is cut
off from its standbys and nothing else. Real processes: what is checked is the step
down through etcd (the key given up, the standby's campaign) under a client's traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import LEASE, kill_all, node_args, primary, sync_named, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, check, report
from support.process import Rsd
from support.proxy import Proxy
from support.submits import Submits, final_reads

EXIT_STEPPED_DOWN = 75


async def test_a_primary_cut_off_from_its_standbys_steps_down(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    proxies = [await Proxy("127.0.0.1", 0).start() for _ in nodes]
    history = History(float(LEASE))
    submits: Submits | None = None

    def args(i: int) -> list[str]:
        return [*node_args(etcd, f"n{i}"), "--advertise", proxies[i].address]

    async def start(i: int) -> None:
        again = nodes[i].port != 0
        if again:  # on its port: recorded no later than the process starts
            history.node("started", nodes[i].address)
        await nodes[i].start(*args(i))
        proxies[i].target = ("127.0.0.1", nodes[i].port)
        if not again:
            history.node("started", nodes[i].address)

    try:
        await asyncio.gather(*(start(i) for i in range(3)))
        async with watch_primaries(nodes, lambda node, epoch: history.node(
                "primary", node.address, epoch)):
            first, probe, epoch = await primary(nodes)
            await probe.close()
            await sync_named(first, nodes)
            submits = Submits(history, ",".join(
                [first.address] + [node.address for node in nodes if node is not first]))
            await submits.start()
            await submits.until_acknowledged(0.0)
            cut = nodes.index(first)
            proxies[cut].cut(replication_only=True)
            # It steps down (nothing acknowledged it), and its synchronous standby leads.
            assert await first.exited(60) == EXIT_STEPPED_DOWN, first.log()[-3000:]
            assert "steps down: no standby has acknowledged anything" in first.log()
            stepped_down = history.now()
            # (the synchronous standby: the one named last, as the cut began, or before)
            _, probe, _ = await primary(
                [node for node in nodes if node is not first], after=epoch, timeout=30)
            await probe.close()
            await submits.until_acknowledged(stepped_down)
            # Still cut off, it starts again (as its supervisor would) and follows.
            await start(cut)
            await submits.until_acknowledged(history.now())
            proxies[cut].heal()
            await submits.stop()
            await final_reads(submits)
    finally:
        if submits is not None:
            await submits.close()
        await kill_all(nodes)
        for proxy in proxies:
            await proxy.close()
        history.dump(tmp_path / "history.jsonl")
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, 0) + f"\nhistory: {tmp_path}/history.jsonl")
