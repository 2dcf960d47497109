"""The metrics endpoint cannot be used to stall or grow rsd: connections are capped (a
newcomer takes the place of the one waited for longest), each must send its request and
take its answer within a deadline (a trickling or non-reading scraper is aborted and its
place freed), a request head is capped, and rendering happens at most once per interval
however fast scrapers ask. Driven in-process on the test's loop with short bounds."""

from __future__ import annotations

import asyncio
import time

from rsd.http.metricshttp import MetricsEndpoint

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


async def endpoint(render_bytes: bytes = b"a 1\n", **bounds: float) -> tuple[
    MetricsEndpoint, int, list[int]
]:
    renders: list[int] = []

    def render() -> bytes:
        renders.append(1)
        return render_bytes

    loop = asyncio.get_running_loop()
    options = {"max_connections": 4, "deadline": 0.3, "max_request": 1024, "min_render": 0.5}
    options.update(bounds)
    ep = MetricsEndpoint(loop, render, **options)  # type: ignore[arg-type]
    _, port = await ep.bind("127.0.0.1", 0)
    await ep.start()
    return ep, port, renders


async def ended(reader: asyncio.StreamReader) -> bool:
    """Whether the server ended the connection (EOF or reset) within 2 s, sending nothing."""
    try:
        return await asyncio.wait_for(reader.read(), 2) == b""
    except ConnectionResetError:
        return True


async def ask(port: int, request: bytes = GET) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()


async def test_trickling_clients_are_cut_off_at_the_deadline_and_the_loop_keeps_time() -> None:
    ep, port, _ = await endpoint()
    held = []
    for _ in range(4):  # every place taken by a client that never finishes its request
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metr")
        held.append((reader, writer))
    await asyncio.sleep(0.05)
    assert len(ep.open) == 4
    # A fifth that asks promptly is served in the place of the one waited for longest.
    assert (await ask(port)).startswith(b"HTTP/1.1 200 OK")
    assert await ended(held.pop(0)[0])
    assert ep.displaced == 1 and ep.refused == 0
    # Meanwhile the loop is free: a timer is on time while they trickle.
    began = time.monotonic()
    for _, writer in held:
        writer.write(b"i")
    await asyncio.sleep(0.05)
    assert time.monotonic() - began < 0.2
    # At the deadline every trickler is aborted, and its place is free again.
    for reader, writer in held:
        assert await ended(reader)
        writer.close()
    assert ep.open == set()
    assert (await ask(port)).startswith(b"HTTP/1.1 200 OK")
    ep.close()


async def test_a_client_that_never_reads_its_answer_is_aborted() -> None:
    ep, port, _ = await endpoint(render_bytes=b"x" * (8 << 20))
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.transport.pause_reading()  # type: ignore[attr-defined]  # never reads
    writer.write(GET)
    await asyncio.sleep(0.1)
    assert len(ep.open) == 1  # the answer is stuck in its buffers
    await asyncio.sleep(0.4)
    assert ep.open == set()  # aborted at the deadline: its buffered answer is gone
    writer.close()
    ep.close()


async def test_an_oversized_request_head_is_refused() -> None:
    ep, port, renders = await endpoint()
    answer = await ask(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 2000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    answer = await ask(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 2000)  # no end yet
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert renders == []
    ep.close()


async def test_scrapes_in_a_loop_render_once_per_interval() -> None:
    ep, port, renders = await endpoint()
    answers = [await ask(port) for _ in range(20)]
    assert all(answer.endswith(b"\r\n\r\na 1\n") for answer in answers)
    assert len(renders) == 1 and ep.scrapes == 20
    await asyncio.sleep(0.5)
    await ask(port)
    assert len(renders) == 2
    ep.close()
