"""The SDK tells "slowed down, retry" from "your token is wrong" (contract 1 of issue 19).

A HELLO answered UNAVAILABLE with ``retry_after_ms`` is tried again after that long:
within ``connect_timeout`` on a first connect (then an UnavailableError says the client
was slowed down), for as long as it lasts while reconnecting a client that was
connected before. A HELLO answered UNAUTHENTICATED is final: raised, never retried. A
scripted server stands in for rsd, so the answers are exactly the ones under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rsclient import AsyncRunstate, AuthenticationError, UnavailableError, wire
from rsproto import ErrorCode, Op


class Scripted:
    """A server answering each connection's HELLO by the next step of ``script``:
    ("slow", ms), ("refuse", None), ("ok", None) (then PINGs are answered) or ("mute",
    None) (never answered)."""

    def __init__(self, script: list[tuple[str, int | None]]) -> None:
        self.script = script
        self.hellos = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        step: tuple[str, int | None] | None = None
        while data := await reader.read(1 << 16):
            for kind, rid, op, _args in decoder.feed(data):
                assert kind == wire.Kind.REQUEST
                if op == Op.HELLO:
                    step = self.script[min(self.hellos, len(self.script) - 1)]
                    self.hellos += 1
                    if step[0] == "mute":
                        continue
                    if step[0] == "ok":
                        writer.write(wire.encode([wire.Kind.REPLY, rid, {
                            "version": 1, "server": "scripted", "connection": self.hellos,
                            "time": 0.0, "limits": {}, "tenant": "t", "role": "admin",
                        }]))
                        continue
                    code = ErrorCode.UNAVAILABLE if step[0] == "slow" else ErrorCode.UNAUTHENTICATED
                    details = {"retry_after_ms": step[1]} if step[0] == "slow" else None
                    writer.write(wire.encode([wire.Kind.ERROR, rid, code, "slowed down", details]))
                    writer.write(wire.encode([wire.Kind.ERROR, 0, code, "handshake failed", None]))
                    writer.close()
                    return
                if op == Op.PING and step is not None and step[0] == "ok":
                    writer.write(wire.encode([wire.Kind.REPLY, rid, {"time": 0.0}]))
        writer.close()

    def drop_connections(self) -> None:
        for writer in self.writers:
            writer.transport.abort()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def scripted() -> AsyncIterator[Any]:
    made: list[Scripted] = []

    async def make(script: list[tuple[str, int | None]]) -> tuple[Scripted, str]:
        server = Scripted(script)
        made.append(server)
        return server, await server.start()

    yield make
    for server in made:
        server.close()


async def test_slowed_down_hellos_are_retried_and_a_refused_one_is_final(scripted: Any) -> None:
    server, address = await scripted([("slow", 30), ("slow", 30), ("refuse", None)])
    client = AsyncRunstate("me", address, token="rsd_wrong", connect_timeout=20)
    with pytest.raises(AuthenticationError):
        await client.ping()
    assert server.hellos == 3  # two slowed down, retried; the refusal ends it
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            await client.ping()
    assert server.hellos == 3  # never retried
    await client.close()


async def test_a_first_connect_slowed_down_past_its_timeout_says_so(scripted: Any) -> None:
    server, address = await scripted([("slow", 100)])
    client = AsyncRunstate("me", address, token="rsd_t", connect_timeout=1.0)
    with pytest.raises(UnavailableError) as failed:
        await client.ping()
    message = failed.value.message
    assert message.startswith(f"cannot reach rsd at {address} within 1 s: ")
    assert "rsd slowed this client down" in message
    assert 2 <= server.hellos <= 10  # retried after retry_after_ms, not hammered
    await client.close()


async def test_a_first_connect_whose_last_attempt_times_out_after_a_slow_down_says_so(
    scripted: Any,
) -> None:
    """The attempt after a slowed-down HELLO is cut short by the connect timeout (here its
    HELLO is never answered; on a loaded machine an answer can simply come too late): the
    error names the slow-down, the cause of the failure, not the timeout."""
    server, address = await scripted([("slow", 100), ("mute", None)])
    client = AsyncRunstate("me", address, token="rsd_t", connect_timeout=1.0)
    with pytest.raises(UnavailableError) as failed:
        await client.ping()
    message = failed.value.message
    assert message.startswith(f"cannot reach rsd at {address} within 1 s: ")
    assert "rsd slowed this client down" in message, message
    assert server.hellos == 2
    await client.close()


async def test_a_reconnect_slowed_down_goes_on_past_the_connect_timeout(scripted: Any) -> None:
    server, address = await scripted([("ok", None), *[("slow", 250)] * 6, ("ok", None)])
    client = AsyncRunstate("me", address, token="rsd_t", connect_timeout=1.0)
    assert await client.ping() == {"time": 0.0}
    server.drop_connections()
    await asyncio.sleep(0.05)
    assert await client.ping() == {"time": 0.0}  # 6 x 250 ms of slowing down: over 1 s
    assert server.hellos == 8
    await client.close()
