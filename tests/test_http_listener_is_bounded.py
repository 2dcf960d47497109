"""The HTTP listener (httpserver.py) cannot be used to stall or grow rsd: connections are
capped (more are closed unread when every place holds a whole request; a newcomer takes
the place of the client that has waited longest for its request: httpplaces.py), a
client that trickles its request or never finishes it is aborted at the deadline and
its place freed, a request head over the bound gets
431 whether it arrives whole or in pieces, a body over the bound gets 413 before it is
read, anything h11 cannot parse gets 400, and an answer worked out later (a future)
still goes out. Driven in-process on the test's loop with short bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.certs import Certs

from rsd.http.httpserver import HttpEndpoint, Request, Response
from rsd.security.tls import server_context

GET = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"


async def endpoint(**bounds: Any) -> tuple[HttpEndpoint, int, list[Request]]:
    seen: list[Request] = []
    loop = asyncio.get_running_loop()

    def handle(request: Request) -> Response | asyncio.Future[Response]:
        seen.append(request)
        if request.path == "/later":
            later: asyncio.Future[Response] = loop.create_future()
            loop.call_later(0.05, later.set_result, Response(200, b"later"))
            return later
        if request.path == "/never":  # an answer never worked out: the deadline ends it
            return loop.create_future()
        return Response(200, b"ok " + request.body)

    options: dict[str, Any] = {"max_connections": 4, "max_per_peer": 4, "max_per_network": 4,
                               "deadline": 0.3, "max_head": 1024, "max_body": 64}
    options.update(bounds)
    ep = HttpEndpoint(loop, handle, **options)
    _, port = await ep.bind("127.0.0.1", 0)
    await ep.start()
    return ep, port, seen


async def ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()


async def ended(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 2) == b""
    except ConnectionResetError:
        return True


async def test_a_request_is_answered_once_and_the_connection_closed() -> None:
    ep, port, seen = await endpoint()
    answer = await ask(port, b"POST /x?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"ok hi")
    assert b"connection: close" in answer.lower()
    assert seen[0].method == "POST" and seen[0].query == {"a": "1"} and seen[0].body == b"hi"
    assert (await ask(port, b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n")).endswith(b"later")
    assert (await ask(port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    assert (await ask(port, b"PUT /x HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
    ep.close()


async def test_trickling_clients_are_cut_off_at_the_deadline() -> None:
    ep, port, _ = await endpoint()
    held = []
    for _ in range(4):  # every place taken by a client that never finishes its request
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTT")
        held.append((reader, writer))
    await asyncio.sleep(0.05)
    assert len(ep.open) == 4
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # one too many:
    assert await ended(held[0][0])  # it takes the place of the one waited for longest
    assert ep.displaced == 1 and ep.refused == 0 and len(ep.open) == 4
    held[0] = (reader, writer)
    for reader, writer in held:  # each aborted at its deadline, answered nothing
        assert await ended(reader)
        writer.close()
    assert (await ask(port, GET)).startswith(b"HTTP/1.1 200 ")  # the places are free again
    ep.close()


async def test_connections_past_the_cap_are_closed_unread_when_no_place_can_be_taken() -> None:
    ep, port, seen = await endpoint()
    held = []
    for _ in range(4):  # every place holds a whole request, its answer not ready
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append((reader, writer))
    while len(seen) < 4:
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # one too many
    writer.write(GET)
    assert await ended(reader)
    writer.close()
    assert ep.refused == 1 and ep.displaced == 0 and len(seen) == 4
    for reader, writer in held:  # each aborted at its deadline
        assert await ended(reader)
        writer.close()
    assert (await ask(port, GET)).startswith(b"HTTP/1.1 200 ")  # the places are free again
    ep.close()


async def test_a_huge_head_gets_431_whole_or_in_pieces() -> None:
    ep, port, seen = await endpoint()
    big = b"GET /x HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 2000
    assert (await ask(port, big + b"\r\n\r\n")).startswith(b"HTTP/1.1 431 ")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for start in range(0, len(big), 100):
        writer.write(big[start:start + 100])
        await writer.drain()
    assert (await asyncio.wait_for(reader.read(), 3)).startswith(b"HTTP/1.1 431 ")
    writer.close()
    assert seen == []
    ep.close()


async def test_a_body_too_large_gets_413_before_it_is_read() -> None:
    ep, port, seen = await endpoint()
    declared = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    assert (await ask(port, declared)).startswith(b"HTTP/1.1 413 ")
    chunked = (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"50\r\n" + b"b" * 80 + b"\r\n0\r\n\r\n")
    assert (await ask(port, chunked)).startswith(b"HTTP/1.1 413 ")
    assert seen == []
    ep.close()


async def test_with_tls_a_connection_shaking_hands_holds_a_place_like_any_other(
    tmp_path: Path,
) -> None:
    """The TLS handshake begins only on an admitted connection (tls.tls_layer, as on the
    protocol port): before, a TLS listener accepted every connection into its handshake
    without counting it, and 300 silent ones held 300 descriptors past every bound."""
    certs = Certs(tmp_path / "certs")
    flags = certs.server_flags()
    context = server_context(flags[flags.index("--tls-cert") + 1],
                             flags[flags.index("--tls-key") + 1], None)
    ep, port, _ = await endpoint(tls=context, deadline=5.0)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]
    for reader, _ in held[:8]:  # past the 4 places: closed, whichever go
        assert await ended(reader)
    assert len(ep.open) <= 4 and ep.refused + ep.displaced >= 8
    for _, writer in held:
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                   ssl=certs.client_context())
    writer.write(GET)
    assert (await asyncio.wait_for(reader.read(), 3)).startswith(b"HTTP/1.1 200 ")
    writer.close()
    ep.close()
