"""The client's connection: connecting, reconnecting and closing end in bounded time with
a typed error and leak nothing; one client serves many coroutines.

Failing to reach a server takes no longer than the connect timeout however many calls
wait; a refused handshake is final; close() stops a reconnect and returns even while the
server is stalled with output unsent; a closed client refuses requests and ends consume().
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import (
    equals,
    now,
    own_client,
    stop_task,
)
from support.process import Rsd, refusing_address

from rsclient import (
    AsyncRunstate,
    InvalidArgumentError,
    RunstateError,
    UnavailableError,
)
from rsclient import connection as connection_module
from rsclient import retry as retry_module

MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# The tests marked ``shared`` need nothing of a fresh server and share one rsd for the
# module (tests/conftest.py); the others count the server's connections, assert a key's
# generations from 1 up (a new key starts above every generation the server handed out,
# in any run), or pause their server.
shared = pytest.mark.rsd_per_module


async def connections(observer: AsyncRunstate) -> int:
    return (await observer.server_stats())["connections"]


def close_leaked(client: AsyncRunstate) -> None:
    """Close sockets the SDK lost track of, so no transport is finalized by the GC later."""
    for obj in gc.get_objects():
        if not isinstance(obj, connection_module._Protocol) or obj.owner is not client._conn:
            continue
        if obj.transport is not None and not obj.transport.is_closing():
            obj.transport.close()


async def test_a_request_cancelled_during_the_handshake_leaks_no_connection(
    rsd: Any, clients: MakeClient, eventually: Eventually
) -> None:
    observer = clients("observer")
    assert await connections(observer) == 1
    rs = clients("impatient")
    rsd.pause()  # the kernel accepts the connection; the HELLO stays unanswered
    try:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(rs.ping(), 0.1)
    finally:
        rsd.resume()
    assert "time" in await rs.ping()
    await rs.close()
    try:
        await eventually(lambda: equals(connections(observer), 1), timeout=5)
    finally:
        close_leaked(rs)


async def test_concurrent_requests_to_an_absent_server_fail_within_the_connect_timeout() -> None:
    with refusing_address() as address:
        async with own_client("alone", address, connect_timeout=1.0) as rs:
            started = now()
            results = await asyncio.gather(*(rs.ping() for _ in range(4)), return_exceptions=True)
            took = now() - started
    assert all(isinstance(r, UnavailableError) for r in results), results
    assert all(r.code == "UNAVAILABLE" for r in results)
    # One connect attempt for all four (four in turn would take 4 s), with room for a
    # loaded machine's stalls (the timeout was 0.3 s and the bound 1.0: 0.7 s of room).
    assert took < 3.0, f"4 concurrent requests took {took:.2f} s to fail (timeout 1 s)"


async def test_close_during_a_reconnect_stops_it(
    restartable: Rsd, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two quick attempts, then a pause far longer than the test: whatever the machine's
    # load, the client is asleep between attempts when rsd is up again and when it is
    # closed (and its connect_timeout is longer still).
    pauses = iter([0.05, 0.1])
    monkeypatch.setattr(retry_module.Backoff, "next_pause",
                        lambda self: next(pauses, 600.0))
    async with own_client("alice", restartable.address, connect_timeout=1200.0) as rs:
        await rs.ping()
        await restartable.stop()
        pinging = asyncio.create_task(rs.ping())
        await asyncio.sleep(0.3)
        await restartable.start()  # up while connect() sleeps before its next attempt
        assert not pinging.done(), "precondition: still reconnecting"
        await rs.close()
        try:
            with pytest.raises(RunstateError) as refused:
                await asyncio.wait_for(pinging, 5)
            assert refused.value.code == "UNAVAILABLE"
        finally:
            close_leaked(rs)


async def test_close_returns_while_the_server_is_stalled_with_unsent_output(
    rsd: Any, clients: MakeClient
) -> None:
    rs = clients("alice")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    rsd.pause()
    sends: list[asyncio.Task[Any]] = []
    try:
        sends = [asyncio.create_task(box.send({"blob": "x" * 200_000})) for _ in range(80)]
        await asyncio.sleep(0.3)
        transport = rs._conn._proto.transport  # type: ignore[union-attr]
        assert transport.get_write_buffer_size() > 0, "precondition: output is stuck"
        closing = asyncio.create_task(rs.close())
        # close() drops what could not be sent within half a second; a hang would last as
        # long as the pause. The bound is far past the half second: 0.7 s was overrun once
        # in a CI-like run on a loaded 2-core machine (the loop's own turns, and failing
        # the 80 sends, come after the half second).
        done, _ = await asyncio.wait({closing}, timeout=5)
        assert closing in done, "close() still hangs 5 s later"
    finally:
        rsd.resume()
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)


@shared
async def test_a_refused_handshake_is_final_and_typed(rsd: Any) -> None:
    """A holder over 256 bytes: the server refuses HELLO; the SDK raises at once with the
    server's code and does not retry for the connect timeout."""
    async with own_client("h" * 300, rsd.address) as rs:
        started = now()
        with pytest.raises(InvalidArgumentError) as refused:
            await rs.ping()
        assert refused.value.code == "INVALID_ARGUMENT"
        assert "holder" in refused.value.message
        assert now() - started < 1.0
        with pytest.raises(InvalidArgumentError):  # still final on the next call
            await rs.ping()


async def test_many_coroutines_share_one_client(clients: MakeClient) -> None:
    """200 coroutines on one connection: grants, releases, tasks and pings all pipelined,
    every reply matched to its request."""
    rs, worker = clients("busy"), clients("worker")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()

    async def one(i: int) -> tuple[int, Any, Any]:
        lease = await run.claim(f"k{i % 50}").acquire(wait=True, timeout_ms=10_000)
        try:
            ticket = await run.mailbox("jobs").submit({"n": i}, key=f"t{i}")
            await rs.ping()
        finally:
            await lease.release()
        return i, ticket.view["key"], lease.key

    results = await asyncio.gather(*(one(i) for i in range(200)))
    assert results == [(i, f"t{i}", f"k{i % 50}") for i in range(200)]
    gens = [(await run.claim(f"k{j}").inspect())["generation"] for j in range(50)]
    assert gens == [4] * 50
    assert (await run.mailbox("jobs").inspect())["ready"] == 200
    assert len(rs._keeper) == 0
    del worker


@shared
async def test_a_closed_client_refuses_requests(clients: MakeClient) -> None:
    rs = clients("alice")
    await rs.ping()
    await rs.close()
    await rs.close()  # idempotent
    with pytest.raises(RunstateError) as refused:
        await rs.ping()
    assert refused.value.code == "UNAVAILABLE"


@shared
async def test_consume_ends_when_its_client_is_closed(clients: MakeClient) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    consumer = asyncio.create_task(box.consume(lambda data, delivery: None))
    await asyncio.sleep(0.2)
    await rs.close()
    try:
        done, _ = await asyncio.wait({consumer}, timeout=5)  # (a hang lasts for ever)
        assert consumer in done, "consume() still running 5 s after close()"
    finally:
        await stop_task(consumer)
