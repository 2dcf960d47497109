"""Nobody's failed HELLOs lock a valid token out: a stranger flooding one address, or
several addresses of its /24, with wrong tokens slows down only the wrong tokens.

rsd checks every token. Past an address's or network's allowance the answer to a wrong
one waits (held, bounded per network), and over that bound it is UNAVAILABLE with
``retry_after_ms`` at once ("slowed down"); a wrong token is never answered as if it
were right. Meanwhile a valid token from the very address under flood is served at once,
and its client keeps its claim across a forced reconnect. The failures make one log
line at once and one summary, not a WARNING each.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsclient import AsyncRunstate, wire
from rsd.security.tokens import hash_token, new_token
from rsd.wire.refusals import MAX_HELD_PER_NETWORK
from rsproto import PROTOCOL_VERSION, ErrorCode, Op

ADMIN = new_token()
SOURCES = {"127.0.0.1": 48, "127.0.0.2": 8, "127.0.0.3": 8, "127.0.0.4": 8, "127.0.0.5": 8}


async def wrong_hello(port: int, source: str, n: int) -> list[Any]:
    """A HELLO with a wrong token from ``source``; every message rsd sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
    args = {"version": PROTOCOL_VERSION, "holder": "guesser", "token": f"rsd_guess_{n}"}
    writer.write(wire.encode([wire.Kind.REQUEST, 1, Op.HELLO, args]))
    messages: list[Any] = []
    try:
        while True:  # a held refusal leaves within ratelimit.MAX_DELAY (5 s)
            data = await asyncio.wait_for(reader.read(1 << 16), 30)
            if not data:
                return messages
            messages.extend(decoder.feed(data))
    except ConnectionResetError:
        return messages
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_a_flood_of_wrong_tokens_slows_them_and_never_the_valid_one(
    rsds: Callable[..., Rsd], raw_connect: Callable[..., Awaitable[Any]],
) -> None:
    server = rsds()
    await server.start("--tokens-file", str(server.write_tokens(f"{hash_token(ADMIN)} ops admin")))
    watcher = await raw_connect(server.address)
    await watcher.hello(token=ADMIN)
    flood = [
        asyncio.create_task(wrong_hello(server.port, source, n))
        for source, count in SOURCES.items() for n in range(count)
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (await watcher.ok(Op.SERVER_STATS, {}))["auth"]["failures"] < sum(SOURCES.values()):
        assert loop.time() < deadline, "the flood did not reach rsd"
        await asyncio.sleep(0.02)
    # the flood is in: 127.0.0.1 and its /24 are far past their allowance
    async with AsyncRunstate("keeper", server.address, token=ADMIN, connect_timeout=10) as rs:
        run = await rs.scopes.create()
        lease = await run.claim("k", lease_seconds=5).acquire()
        stats = (await rs.server_stats())["auth"]
        assert stats["failures"] == sum(SOURCES.values())
        assert stats["delayed"] > 0 and stats["throttled"] > 0
        proto = rs._conn._proto
        assert proto is not None and proto.transport is not None
        proto.transport.abort()  # a forced reconnect, from the flooded address
        await asyncio.sleep(0.05)
        assert "time" in await rs.ping()  # served again: reconnected with the same token
        await lease.renew()  # the claim survived the reconnect
        view = await run.claim("k").inspect()
        assert view["held"] and view["generation"] == lease.generation
        assert not lease.is_lost
        await lease.release()

    # Every refusal not held is answered at once; the held ones (at most one network's
    # bound) within ratelimit.MAX_DELAY: those are tested on their own (test_auth_rules).
    deadline = loop.time() + 10
    while sum(not task.done() for task in flood) > MAX_HELD_PER_NETWORK:
        assert loop.time() < deadline, "refusals neither answered nor held"
        await asyncio.sleep(0.05)
    for task in flood:
        task.cancel()
    done = await asyncio.gather(*flood, return_exceptions=True)
    answers = [messages for messages in done if isinstance(messages, list)]
    codes: dict[str, int] = {}
    for messages in answers:
        assert len(messages) == 2, messages  # the HELLO's answer, then the connection's
        hello, final = messages
        assert hello[:2] == [wire.Kind.ERROR, 1] and final[:2] == [wire.Kind.ERROR, 0]
        code = hello[2]
        codes[code] = codes.get(code, 0) + 1
        if code == ErrorCode.UNAVAILABLE:  # slowed down: retry later, not "wrong token"
            details = hello[4]
            assert type(details["retry_after_ms"]) is int and details["retry_after_ms"] >= 1
            assert "slowed down" in hello[3]
        else:
            assert code == ErrorCode.UNAUTHENTICATED and hello[3] == "the token is not valid"
    assert codes[ErrorCode.UNAUTHENTICATED] >= 10 and codes[ErrorCode.UNAVAILABLE] > 0
    assert await server.stop() == 0
    log = server.log()
    assert log.count("authentication failed from") == 1  # the first of the interval
    assert "handshake failed" not in log and "slowed down" not in log  # no line per refusal
    assert f"{sum(SOURCES.values())} failed HELLOs from {len(SOURCES)} addresses" in log
