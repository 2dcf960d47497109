"""A synchronous standby that hangs (SIGSTOP: a VM freeze, a stuck disk; its kernel
still acknowledges the stream's TCP data, so no TCP timeout ever fires) is replaced by
the primary once it has acknowledged nothing for the cluster lease (feeds.py: the
stream's own deadline): the other standby, caught up, is named the synchronous standby
in etcd, and writes go on while the hung one is still stopped; nothing acknowledged is
lost (the history checker, support/history.py, over keyed submits and final reads).

Why a real cluster and not only a fake clock: what is checked is that a process that is
really stopped, whose kernel keeps the TCP connection alive, is seen as gone, and that
the new synchronous standby is named in etcd before anything more is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import (
    LEASE,
    kill_all,
    named_syncs,
    primary,
    start_all,
    sync_named,
    watch_primaries,
)
from support.etcd import EtcdCluster
from support.history import History, check, report
from support.process import Rsd
from support.submits import Submits, final_reads


async def test_a_hung_sync_standby_is_replaced(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE))
    submits: Submits | None = None
    try:
        await start_all(etcd, nodes)
        for node in nodes:
            history.node("started", node.address)
        async with watch_primaries(nodes, lambda node, epoch: history.node(
                "primary", node.address, epoch)):
            first, probe, epoch = await primary(nodes)
            await probe.close()
            await sync_named(first, nodes)
            submits = Submits(history, ",".join(node.address for node in nodes))
            await submits.start()
            await submits.until_acknowledged(0.0)
            namings = len(named_syncs(first.log()))
            hung = await sync_named(first, nodes, after=namings - 1)  # the one named last
            other = next(node for node in nodes if node not in (first, hung))
            paused = history.node("paused", hung.address)
            hung.pause()
            # The primary replaces it (while it is still stopped) with the other standby.
            replacement = await sync_named(first, nodes, after=namings)
            replaced_at = history.now()
            assert replacement is other, first.log()[-3000:]
            hung_name = f"n{nodes.index(hung)}"
            assert f"standby {hung_name} has acknowledged nothing" in first.log()
            # Writes go on before the hung standby wakes.
            await submits.until_acknowledged(replaced_at)
            assert hung.proc is not None and hung.proc.poll() is None  # still stopped
            history.node("resumed", hung.address)
            hung.resume()
            await submits.until_acknowledged(history.now())
            _, probe, last = await primary(nodes)
            await probe.close()
            assert (last, first.alive) == (epoch, True), "the primary stayed the primary"
            await submits.stop()
            await final_reads(submits)
        print(f"paused at {paused.at:.2f} s, replaced as the synchronous standby at "
              f"{replaced_at:.2f} s")
    finally:
        if submits is not None:
            await submits.close()
        await kill_all(nodes)
        history.dump(tmp_path / "history.jsonl")
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, 0) + f"\nhistory: {tmp_path}/history.jsonl")
