"""Connection life is visible: events in order across a real server restart, and what
was in flight carries on through it.

A client tells ``connected``, then, when its server is killed and restarted on the same
port and data directory, ``disconnected``, ``reconnecting`` and ``restored``, to
callbacks and to iterators alike, without ever waiting for them; after the restore a
held lease is still held, a parked claim wait is granted, a pending result wait gets its
result, a running handler's delivery settles, and a consumer takes new work. The rare
events are logged on the ``rsclient`` logger with structured extras.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest

from rsclient import AsyncRunstate, ConnectionEvent
from rsclient.events import MAX_QUEUED, ConnectionEvents

IN_ORDER = ["connected", "disconnected", "reconnecting", "restored"]
# The leases held across the restart. The SDK gives a lease up once no renewal was
# confirmed for its length less a margin (5 s: 4 s after the last renewal's send, which
# may be 1.7 s before the kill), however the server fares meanwhile; a kill, a new rsd
# process and the client's reconnect (its backoff pauses up to 2 s) took longer than
# that at load 12-19, and every lease was lost. Long enough to outlast a start allowed
# READY_TIMEOUT (15 s) on a loaded machine; nothing here waits one out.
LIVE_LEASE = 60


def collapsed(kinds: list[str]) -> list[str]:
    """Repeats of one kind in a row told once (a long outage may say "reconnecting" twice)."""
    return [kind for kind, _ in itertools.groupby(kinds)]


async def until(check: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def test_events_in_order_and_everything_restored_across_a_restart(
    restartable: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rsclient")
    rs = AsyncRunstate(holder="worker", address=restartable.address)
    other = AsyncRunstate(holder="other", address=restartable.address)
    called: list[str] = []
    streamed: list[ConnectionEvent] = []
    rs.on_connection_event(lambda event: called.append(event.kind))
    rs.on_connection_event(lambda event: 1 / 0)  # a failing callback hurts nobody

    async def read() -> None:
        async for event in rs.connection_events():
            streamed.append(event)
            if event.kind == "restored":
                return

    reader = asyncio.create_task(read())
    go = asyncio.Event()
    handled: list[int] = []

    async def handle(data: dict[str, int], delivery: Any) -> dict[str, int]:
        handled.append(data["n"])
        if data["n"] == 1:
            await go.wait()  # still running when the server goes away
        return data

    try:
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create()
        held = await run.claim("held", lease_seconds=LIVE_LEASE).acquire()
        busy = await other.scope(run.id).claim("busy", lease_seconds=LIVE_LEASE).acquire()
        waiter = asyncio.create_task(run.claim("busy").acquire(wait=True, timeout_ms=30_000))
        consumer = asyncio.create_task(
            run.mailbox("jobs").consume(handle, lease_seconds=LIVE_LEASE)
        )
        first = await run.mailbox("jobs").submit({"n": 1}, key="first")
        result = asyncio.create_task(first.result(timeout_ms=30_000))
        await until(lambda: handled == [1])

        await restartable.kill()
        await restartable.start()
        await until(lambda: "restored" in called)

        await held.renew()
        assert not held.is_lost and not busy.is_lost
        go.set()
        assert (await result)["state"] == "SUCCEEDED"
        second = await run.mailbox("jobs").submit({"n": 2}, key="second")
        assert (await second.result(timeout_ms=10_000))["state"] == "SUCCEEDED"
        await busy.release()
        granted = await waiter
        assert granted.generation > busy.generation
        await asyncio.wait_for(reader, 5)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await granted.release()
        await held.release()
    finally:
        reader.cancel()
        await rs.close()
        await other.close()

    assert collapsed(called) == IN_ORDER
    assert collapsed([event.kind for event in streamed]) == IN_ORDER
    assert all(event.address == restartable.address for event in streamed)
    assert streamed[1].cause  # the disconnect says why
    restored = [r for r in caplog.records if r.getMessage().endswith("restored")]
    assert restored and restored[0].address == restartable.address  # type: ignore[attr-defined]


async def test_a_reader_that_falls_behind_loses_the_oldest_events_not_the_client() -> None:
    events = ConnectionEvents("127.0.0.1:1")
    stream = events.stream()
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # the reader is registered and waiting
    events.emit("connected")
    assert (await pending).kind == "connected"
    for _ in range(MAX_QUEUED + 10):
        events.emit("reconnecting")  # nobody reads: emitting never waits
    events.emit("restored")
    first = await anext(stream)
    assert first.dropped == 11  # the 10 over the bound, and the one "restored" pushed out
    await stream.aclose()


async def test_a_lost_lease_is_logged_with_scope_key_and_generation(
    caplog: pytest.LogCaptureFixture, restartable: Any
) -> None:
    async with AsyncRunstate(holder="h", address=restartable.address) as rs:
        run = await rs.scopes.create()
        lease = await run.claim("k", lease_seconds=5).acquire()
        with caplog.at_level(logging.WARNING, logger="rsclient"):
            await run.cancel("done")  # the run's claims end: the server tells the holder
            await until(lambda: lease.is_lost, timeout=5)
        record = next(r for r in caplog.records if "lost" in r.getMessage())
        assert (record.scope, record.key, record.generation) == (  # type: ignore[attr-defined]
            run.id, "k", lease.generation
        )
