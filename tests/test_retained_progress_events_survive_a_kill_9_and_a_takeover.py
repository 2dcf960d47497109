"""A task's retained progress events are journaled: after a kill -9 of rsd, and after a
cluster's primary is killed and a standby takes over, a follower gets the same events
with the same seqs, and the worker's next event (its delivery kept through the restart)
takes the next seq. The core rebuilds them alike from the journal and from a snapshot
(tests/test_core_progress_events_are_retained_bounded_fenced_and_replayed.py); these
two prove the records reach a real disk and a standby's. Kept few: one task each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from support.cluster import kill_all, start_all, sync_named
from support.cluster import primary as primary_of
from support.etcd import EtcdCluster
from support.process import Rsd

from rsclient import AsyncRunstate
from rsclient.progress import TaskEvent
from tests.support import aio


async def collect(events: object) -> list[TaskEvent]:
    return [event async for event in events]  # type: ignore[attr-defined]


def kinds(events: list[TaskEvent]) -> list[tuple[int, str, object]]:
    return [(event.seq, event.kind, event.data or event.state) for event in events]


BEFORE = [(1, "state", "RUNNING"), (2, "progress", "a"), (3, "progress", "b")]


async def test_retained_events_outlive_a_kill_9(rsds: Callable[..., Rsd]) -> None:
    server = rsds("progress")
    address = await server.start()
    worker = AsyncRunstate(holder="worker", address=address)
    try:
        await worker.mailboxes.ensure("jobs")
        run = await worker.scopes.create(id="r")
        ticket = await run.mailbox("jobs").submit(None)
        delivery = await run.mailbox("jobs").receive()
        assert delivery is not None
        await delivery.progress("a")
        await delivery.progress("b")
        await server.kill()
        await server.start()
        async with AsyncRunstate(holder="watcher", address=address) as watcher:
            events = watcher.scope("r").task(ticket.id).events()
            kept = [await anext(events) for _ in range(3)]
            assert kinds(kept) == BEFORE
            # The worker's client reconnects; its delivery was kept: the next seq is 4.
            assert await asyncio.wait_for(delivery.progress("c"), 30) == 4
            await delivery.complete({"payload": "done"})
            rest = await asyncio.wait_for(collect(events), 30)
            assert kinds(rest) == [(4, "progress", "c"), (5, "outcome", "SUCCEEDED")]
    finally:
        await aio.close_quietly(worker)
    assert await server.stop() == 0


async def test_retained_events_outlive_a_takeover(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(2)]
    try:
        await start_all(etcd, nodes)
        primary, rs, epoch = await primary_of(nodes)
        await sync_named(primary, nodes)  # acknowledged changes are on the standby too
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create(id="r")
        ticket = await run.mailbox("jobs").submit(None)
        delivery = await run.mailbox("jobs").receive()
        assert delivery is not None
        await delivery.progress("a")
        await delivery.progress("b")
        await rs.close()
        await primary.kill()
        standby = next(node for node in nodes if node is not primary)
        _, rs2, _ = await primary_of([standby], after=epoch, timeout=30.0)
        try:
            events = rs2.scope("r").task(ticket.id).events()
            kept = [await anext(events) for _ in range(3)]
            assert kinds(kept) == BEFORE
            await events.aclose()  # type: ignore[attr-defined]
        finally:
            await rs2.close()
    finally:
        await kill_all(nodes)
        etcd.stop()
