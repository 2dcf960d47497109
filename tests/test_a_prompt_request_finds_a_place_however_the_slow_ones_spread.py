"""A request that sends its head promptly finds a place on the HTTP listener, however
the slow connections holding the places are spread: over 64 or 128 /24 networks, one
connection each, or over 8 addresses of the scraper's own /24. A newcomer takes the place
of the connection that has waited longest for its whole request (httpplaces.py).

Before: the shares per address and per network alone left 64 networks holding every
place, and 8 addresses of the scraper's /24 holding that network's share: 1 of 24 scrapes
served with 64 networks, 0 of 24 with 128 (issue 30; ``python -m bench.metrics_slowloris
--networks 64``). Counted, not timed. Driven in-process on the test's loop with the
listener's production bounds; the slow ones bind other loopback addresses (Linux routes
all of 127/8 to lo), the scraper is 127.0.0.1. The rules themselves, one by one, on the
pure table: test_http_places_go_to_the_prompt.py.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rsd.http.httpserver import HttpEndpoint, Request, Response

GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


async def listener() -> tuple[HttpEndpoint, int]:
    def handle(request: Request) -> Response:
        return Response(200, b"a 1\n")

    # The production bounds; a deadline long enough that no slow connection is cut off
    # during the test: only a newcomer frees a place.
    ep = HttpEndpoint(asyncio.get_running_loop(), handle, deadline=60.0)
    _, port = await ep.bind("127.0.0.1", 0)
    await ep.start()
    return ep, port


async def slowloris(port: int, sources: list[str]) -> Held:
    """One connection from each source, each sending half a request head."""
    held: Held = []
    for source in sources:
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(source, 0))
        writer.write(b"GET /metr")
        held.append((reader, writer))
        await asyncio.sleep(0)  # in order: the server admits them one by one
    await asyncio.sleep(0.1)
    return held


async def served(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                   local_addr=("127.0.0.1", 0))
    try:
        writer.write(GET)
        return (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200 OK")
    except ConnectionResetError:
        return False
    finally:
        writer.close()


async def close(held: Held) -> None:
    for _, writer in held:
        writer.close()
    for _, writer in held:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.mark.parametrize("networks", [64, 128])
async def test_slow_connections_from_many_networks_leave_a_place_for_a_prompt_request(
    networks: int,
) -> None:
    ep, port = await listener()
    held = await slowloris(port, [f"127.{1 + n // 256}.{n % 256}.2" for n in range(networks)])
    assert len(ep.open) == ep.max_connections  # every place held by a slow one
    answers = [await served(port) for _ in range(24)]
    assert answers.count(True) == 24
    # the newcomers past 64 took slow ones' places, then the first scrape did
    assert ep.refused == 0 and ep.displaced >= networks - ep.max_connections + 1
    await close(held)
    ep.close()


async def test_slow_addresses_of_the_scrapers_own_network_leave_it_a_place() -> None:
    ep, port = await listener()
    sources = [f"127.0.0.{2 + n}" for n in range(8)]
    held = await slowloris(port, [source for source in sources for _ in range(8)])
    assert len(ep.open) == ep.max_per_network  # the network's share, all slow
    answers = [await served(port) for _ in range(24)]
    assert answers.count(True) == 24 and ep.refused == 0
    await close(held)
    ep.close()
