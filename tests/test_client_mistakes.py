"""A user's mistakes are caught early, each with the right error and one clear message.

A malformed address is an InvalidArgumentError at construction; a server that cannot be
reached (nothing listening, a listener that closes at once, answers junk or says
nothing) is one UnavailableError within ``connect_timeout`` naming the address and the
cause; a closed client says "client is closed"; a client used from a second event loop
says so instead of failing inside asyncio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from support.process import refusing_address

from rsclient import AsyncRunstate, InvalidArgumentError, RunstateError, UnavailableError
from rsclient.connection import OTHER_LOOP

TIMEOUT = 2.0  # the connect_timeout these tests give; the error must come within it
SLACK = 1.5  # seconds of scheduling slack on a loaded machine (a second attempt: 4 s)


@pytest.mark.parametrize("address", ["localhost", "host:99999", "host:abc", "", "host:0", ":80"])
def test_a_malformed_address_is_refused_at_construction(address: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        AsyncRunstate(holder="me", address=address)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert repr(address) in refused.value.message


@pytest.mark.parametrize("timeout", [0, -1, "5", True])
def test_a_bad_connect_timeout_is_refused_at_construction(timeout: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="connect_timeout"):
        AsyncRunstate(holder="me", address="127.0.0.1:1", connect_timeout=timeout)


async def unreachable(address: str) -> UnavailableError:
    """The error of a ping to ``address``, checked to come within the connect timeout."""
    started = time.monotonic()
    async with asyncio.timeout(TIMEOUT + SLACK):
        rs = AsyncRunstate(holder="me", address=address, connect_timeout=TIMEOUT)
        try:
            with pytest.raises(UnavailableError) as failed:
                await rs.ping()
        finally:
            await rs.close()
    assert time.monotonic() - started < TIMEOUT + SLACK
    error = failed.value
    assert str(error).count("UNAVAILABLE") == 1, str(error)
    assert error.message.startswith(f"cannot reach rsd at {address} within {TIMEOUT:g} s: ")
    return error


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def listener() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """``await listener(handler)``: a TCP server that is not rsd; its address."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


async def test_nothing_listening_is_unavailable_naming_the_refusal() -> None:
    with refusing_address() as address:
        error = await unreachable(address)
    assert error.message.endswith("connection refused (is rsd running there?)")


async def test_a_listener_that_closes_at_once_is_unavailable_naming_it(listener: Any) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    error = await unreachable(await listener(hang_up))
    assert "closed the connection before answering the handshake" in error.message


async def test_an_attempt_that_times_out_keeps_the_cause_an_earlier_attempt_found(
    listener: Any,
) -> None:
    """A listener that hangs up at once, then says nothing on the connections after: the
    later attempts time out, and the error still names the hang-up. (Under load, the
    last attempt of a connect to a listener that always hangs up got only what was left
    of the timeout, timed out, and its "timed out" replaced the cause.)"""
    hung_up: list[bool] = []

    async def hang_up_then_say_nothing(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if not hung_up:
            hung_up.append(True)
            writer.close()
            return
        await reader.read()  # until the client gives up

    error = await unreachable(await listener(hang_up_then_say_nothing))
    assert hung_up
    assert "closed the connection before answering the handshake" in error.message


async def test_a_listener_that_answers_junk_is_unavailable_naming_it(listener: Any) -> None:
    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await reader.read(1000)

    error = await unreachable(await listener(junk))
    assert "answered with bytes that are not rsd's protocol" in error.message


async def test_a_listener_that_never_answers_is_unavailable_within_the_timeout(
    listener: Any,
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(100_000):  # reads the HELLO, answers nothing, until EOF
            pass

    error = await unreachable(await listener(silent))
    assert error.message.endswith(": timed out")


async def test_calls_after_close_say_the_client_is_closed(rsd: Any) -> None:
    rs = AsyncRunstate(holder="me", address=rsd.address)
    run = await rs.scopes.create()
    await rs.close()
    for call in (rs.ping(), run.claim("k").acquire(), run.mailbox("m").send({})):
        with pytest.raises(UnavailableError) as refused:
            await call
        assert refused.value.message == "client is closed"


def test_a_client_used_from_a_second_event_loop_says_so(rsd: Any) -> None:
    rs = AsyncRunstate(holder="me", address=rsd.address)
    asyncio.run(rs.ping())
    with pytest.raises(RunstateError) as refused:
        asyncio.run(rs.ping())
    assert refused.value.message == OTHER_LOOP
    asyncio.run(rs.close())  # closing from another loop still works, quietly
    with pytest.raises(UnavailableError, match="client is closed"):
        asyncio.run(rs.ping())
