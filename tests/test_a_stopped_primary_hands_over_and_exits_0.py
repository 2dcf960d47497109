"""SIGTERM of a primary is a clean stop, whatever runs meanwhile: it hands over (its
synchronous standby takes over at once) and exits 0, never 75 (``systemctl stop`` must
not leave the unit failed). As it stops, its standbys stop following: it names no
synchronous standby any more, and the end of its term (a core timer of its parked
consumers still firing after the elector stopped) is no step down.

A rolling restart of the primary, three times, under keyed submits (recorded: the
history checker, support/history.py, finds nothing acknowledged lost) and consumers
parked on the primary (their waits arm its core timer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cluster import (
    LEASE,
    kill_all,
    named_syncs,
    node_args,
    primary,
    start_all,
    sync_named,
    watch_primaries,
)
from support.etcd import EtcdCluster
from support.history import History, check, report
from support.process import Rsd
from support.submits import MAILBOX, Submits, final_reads

from rsclient.deliveries import Delivery

STOPS = 3
CONSUMERS = 3


async def test_a_stopped_primary_hands_over_and_exits_0(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE))
    submits: Submits | None = None
    stop = asyncio.Event()
    consumers: list[asyncio.Task[None]] = []

    async def handle(data: Any, delivery: Delivery) -> None:
        await asyncio.sleep(0.01)
        await delivery.complete(result={"n": data["n"]})

    try:
        await start_all(etcd, nodes)
        for node in nodes:
            history.node("started", node.address)
        async with watch_primaries(nodes, lambda node, epoch: history.node(
                "primary", node.address, epoch)):
            first, probe, epoch = await primary(nodes)
            await probe.close()
            submits = Submits(history, ",".join(node.address for node in nodes))
            await submits.start()
            for i in range(CONSUMERS):
                _, rs = submits.client(f"consumer-{i}")
                consumers.append(asyncio.get_running_loop().create_task(
                    rs.scope(submits.run_id).mailbox(MAILBOX).consume(
                        handle, concurrency=4, stop_event=stop, shutdown_timeout=1.0,
                        on_error=lambda exc, delivery: None)))
            leader = first
            for _ in range(STOPS):
                await sync_named(leader, nodes)
                await submits.until_acknowledged(history.now())
                code = await leader.stop()
                log = leader.log()
                assert code == 0, log[-3000:]
                stopping = log[log.index("rsd stopping"):]
                assert not named_syncs(stopping), stopping
                others = [node for node in nodes if node is not leader]
                successor, probe, epoch = await primary(others, after=epoch)
                await probe.close()
                history.node("started", leader.address)
                await leader.start(*node_args(etcd, f"n{nodes.index(leader)}"))
                leader = successor
            await submits.until_acknowledged(history.now())
            stop.set()
            await submits.stop()
            await final_reads(submits)
    finally:
        stop.set()
        for task in consumers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
        if submits is not None:
            await submits.close()
        await kill_all(nodes)
        history.dump(tmp_path / "history.jsonl")
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, 0) + f"\nhistory: {tmp_path}/history.jsonl")
