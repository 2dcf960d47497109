"""A slowloris cannot blind the metrics endpoint: one host holds at most its share of the
places (per address, then per network), and when every place is taken by many networks
a newcomer from a network holding fewer takes the oldest place of the one holding the
most. Meanwhile a well-behaved scraper from another address gets every scrape served.

Before the shares, 16 slow connections from one host took every place and 23 of 24
scrapes were refused. Driven in-process on the test's loop; the attackers bind other
loopback addresses (Linux routes all of 127/8 to lo), the scraper is 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib

from rsd.http.metricshttp import MetricsEndpoint
from rsd.security.ratelimit import peer_keys

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


async def endpoint() -> tuple[MetricsEndpoint, int]:
    loop = asyncio.get_running_loop()
    # The production shares; a deadline long enough that no slow connection is cut off
    # during the test (the deadline is test_metrics_endpoint_is_bounded's subject).
    ep = MetricsEndpoint(loop, lambda: b"a 1\n", deadline=60.0, min_render=0.0)
    _, port = await ep.bind("127.0.0.1", 0)
    await ep.start()
    return ep, port


async def slowloris(port: int, sources: list[str], each: int) -> Held:
    """``each`` connections from every source address, each sending half a request."""
    held: Held = []
    for source in sources:
        for _ in range(each):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
            writer.write(b"GET /metr")
            held.append((reader, writer))
            await asyncio.sleep(0)  # in order: the server admits them one by one
    await asyncio.sleep(0.1)
    return held


async def scrape(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.1", 0))
    try:
        writer.write(GET)
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def close(held: Held) -> None:
    for _, writer in held:
        writer.close()
    for _, writer in held:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def open_from(ep: MetricsEndpoint, prefix: str) -> int:
    peers = [scrape.transport.get_extra_info("peername") for scrape in ep.open if scrape.transport]
    return sum(1 for peer in peers if peer[0].startswith(prefix))


async def test_one_slow_host_holds_its_share_and_every_scrape_is_served() -> None:
    ep, port = await endpoint()
    held = await slowloris(port, ["127.0.0.2"], 40)
    answers = [await scrape(port) for _ in range(24)]
    assert all(answer.startswith(b"HTTP/1.1 200 OK") for answer in answers)
    assert open_from(ep, "127.0.0.2") == ep.max_per_peer  # its share; the rest closed unread
    await close(held)
    ep.close()


async def test_many_addresses_of_one_network_hold_that_networks_share() -> None:
    ep, port = await endpoint()
    held = await slowloris(port, [f"127.0.1.{n}" for n in range(2, 12)], 4)
    answers = [await scrape(port) for _ in range(24)]
    assert all(answer.startswith(b"HTTP/1.1 200 OK") for answer in answers)
    assert open_from(ep, "127.0.1.") == ep.max_per_network
    await close(held)
    ep.close()


async def test_when_many_networks_fill_every_place_a_newcomer_takes_the_largest_ones_oldest() -> (
    None
):
    ep, port = await endpoint()
    sources = [f"127.1.{n}.{m}" for n in range(8) for m in (2, 3)]
    held = await slowloris(port, sources, 4)
    assert len(ep.open) == ep.max_connections
    answers = [await scrape(port) for _ in range(24)]
    assert all(answer.startswith(b"HTTP/1.1 200 OK") for answer in answers)
    assert ep.displaced > 0  # networks 2..7 took places from 0 and 1, then the scraper
    assert max(open_from(ep, f"127.1.{n}.") for n in range(8)) <= 3  # shared out
    assert len(ep.open) <= ep.max_connections
    await close(held)
    ep.close()


def test_a_scraper_counts_against_the_same_address_and_network_as_a_hello() -> None:
    """One prefix rule for the metrics shares and for HELLO failures (ratelimit.peer_keys)."""
    def network_key(host: str) -> str:
        return peer_keys(host).network

    assert network_key("10.1.2.3") == network_key("10.1.2.200") == "10.1.2.0/24"
    assert network_key("10.1.3.3") != network_key("10.1.2.3")
    assert network_key("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert network_key("2001:db8:1:2::5") == network_key("2001:db8:1:2f::1") == "2001:db8:1::/56"
    assert network_key("2001:db8:1:100::5") != network_key("2001:db8:1:2::5")
    assert peer_keys("10.1.2.3").address == "10.1.2.3"
