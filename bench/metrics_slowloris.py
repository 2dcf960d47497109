"""Legitimate scrapes of the metrics endpoint served while one host runs a slowloris.

A fresh rsd with ``--metrics-listen``; an attacker (a process of its own) keeps
``--slow`` connections open (each sends half a request head, then a byte a second, and
is opened again whenever rsd closes it) from ``--networks`` IPv4 /24 networks (one
address in each: 127.N.M.2; Linux routes all of 127/8 to lo), or with ``--own-network``
from that many addresses in the scraper's own /24 (127.0.0.2, 127.0.0.3, ...); meanwhile
a scraper on 127.0.0.1 asks ``GET /metrics`` ``--scrapes`` times, one every
``--interval`` seconds. Prints how many were served (a 200 with a body) and how many
were refused or cut off (issue 19: 1 of 24 served from one host before the per-peer
share; issue 30: 1 of 24 from 64 networks, 0 of 24 from 128, 0 of 24 from 8 addresses of
the scraper's /24, before a newcomer took the place of the slowest unfinished request).

    .venv/bin/python -m bench.metrics_slowloris [--scrapes 24] [--slow 64] [--interval 0.25]
        [--networks 1 | --own-network 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import tempfile
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

from bench.harness import start_rsd, stop_rsd

SCRAPER = "127.0.0.1"
GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def attackers(networks: int, own_network: int) -> list[str]:
    """The attacker's source addresses: one in each of ``networks`` /24s, or
    ``own_network`` of the scraper's own /24."""
    if own_network:
        return [f"127.0.0.{2 + n}" for n in range(own_network)]
    return [f"127.{1 + n // 256}.{n % 256}.2" for n in range(networks)]


async def _slow_connection(port: int, source: str, stop: asyncio.Event,
                           opened: list[int]) -> None:
    """One slow client: half a request, then a byte a second; reopened when closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
        except OSError:
            await asyncio.sleep(0.05)
            continue
        opened[0] += 1
        try:
            writer.write(b"GET /metr")
            while not stop.is_set() and not reader.at_eof():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), 1.0)
                writer.write(b"i")
        except OSError:
            pass
        finally:
            writer.close()
        await asyncio.sleep(0.01)


async def _scrape(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(SCRAPER, 0)
        )
    except OSError:
        return False
    try:
        writer.write(GET)
        answer = await asyncio.wait_for(reader.read(), 5.0)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
    return answer.startswith(b"HTTP/1.1 200 OK") and b"rsd_uptime_seconds" in answer


async def _attack(port: int, sources: list[str], slow: int, stop: MpEvent,
                  opened: Synchronized[int]) -> None:
    running = asyncio.Event()
    count = [0]
    tasks = [asyncio.create_task(_slow_connection(
        port, sources[n % len(sources)], running, count)) for n in range(slow)]
    while not stop.is_set():
        await asyncio.sleep(0.05)
    running.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    opened.value = count[0]


def _attacker(port: int, sources: list[str], slow: int, stop: MpEvent,
              opened: Synchronized[int]) -> None:
    """The slowloris, in a process of its own: a real scraper does not share its loop
    with the attacker (sharing it, the scraper sends its request late, and looks slow)."""
    asyncio.run(_attack(port, sources, slow, stop, opened))


async def measure(scrapes: int, slow: int, interval: float, sources: list[str]
                  ) -> dict[str, object]:
    port = _free_port()
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    opened = spawn.Value("q", 0)
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as data:
        server = await start_rsd(Path(data), "--metrics-listen", f"127.0.0.1:{port}")
        attacker = spawn.Process(target=_attacker, args=(port, sources, slow, stop, opened))
        try:
            attacker.start()
            await asyncio.sleep(2.0)  # the slowloris takes what it can first
            served = 0
            for _ in range(scrapes):
                served += await _scrape(port)
                await asyncio.sleep(interval)
        finally:
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, attacker.join, 30)
            await stop_rsd(server.proc)
    return {"scrapes": scrapes, "served": served, "refused": scrapes - served,
            "slow_connections": slow, "slow_sources": len(sources),
            "slow_opened": opened.value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=24)
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.25)
    spread = parser.add_mutually_exclusive_group()
    spread.add_argument("--networks", type=int, default=1,
                        help="the slow connections come from this many /24s (one address each)")
    spread.add_argument("--own-network", type=int, default=0,
                        help="... or from this many addresses of the scraper's own /24")
    args = parser.parse_args()
    sources = attackers(args.networks, args.own_network)
    result = asyncio.run(measure(args.scrapes, args.slow, args.interval, sources))
    print(json.dumps(result))
    where = (f"{len(sources)} addresses of the scraper's /24" if args.own_network
             else f"{len(sources)} /24 networks")
    print(f"{result['served']} of {result['scrapes']} legitimate scrapes served during a "
          f"slowloris of {result['slow_connections']} connections from {where}")


if __name__ == "__main__":
    main()
