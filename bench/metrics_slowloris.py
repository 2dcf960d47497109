"""Legitimate scrapes of the metrics endpoint served while one host runs a slowloris.

A fresh rsd with ``--metrics-listen``; an attacker bound to 127.0.0.2 keeps ``--slow``
connections open (each sends half a request head, then a byte a second, and is opened
again whenever rsd closes it); meanwhile a scraper on 127.0.0.1 asks ``GET /metrics``
``--scrapes`` times, one every ``--interval`` seconds. Prints how many were served (a
200 with a body) and how many were refused or cut off (issue 19: 1 of 24 served before
the per-peer share).

    .venv/bin/python -m bench.metrics_slowloris [--scrapes 24] [--slow 64] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import tempfile
from pathlib import Path

from bench.harness import start_rsd, stop_rsd

ATTACKER = "127.0.0.2"
GET = b"GET /metrics HTTP/1.1\r\nHost: rsd\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _slow_connection(port: int, stop: asyncio.Event, opened: list[int]) -> None:
    """One slow client: half a request, then a byte a second; reopened when closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
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
            "127.0.0.1", port, local_addr=("127.0.0.1", 0)
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


async def measure(scrapes: int, slow: int, interval: float) -> dict[str, object]:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as data:
        server = await start_rsd(Path(data), "--metrics-listen", f"127.0.0.1:{port}")
        stop = asyncio.Event()
        opened = [0]
        try:
            attackers = [asyncio.create_task(_slow_connection(port, stop, opened))
                         for _ in range(slow)]
            await asyncio.sleep(1.0)  # the slowloris takes what it can first
            served = 0
            for _ in range(scrapes):
                served += await _scrape(port)
                await asyncio.sleep(interval)
            stop.set()
            await asyncio.gather(*attackers, return_exceptions=True)
        finally:
            await stop_rsd(server.proc)
    return {"scrapes": scrapes, "served": served, "refused": scrapes - served,
            "slow_connections": slow, "slow_opened": opened[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=24)
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    result = asyncio.run(measure(args.scrapes, args.slow, args.interval))
    print(json.dumps(result))
    print(f"{result['served']} of {result['scrapes']} legitimate scrapes served during a "
          f"slowloris of {result['slow_connections']} connections from {ATTACKER}")


if __name__ == "__main__":
    main()
