"""The protocol port's latency while dashboards poll (issue 24's closing figure).

A fresh rsd with ``--http-listen``, holding a run with claims, tasks, groups and dead
letters; a bystander client PINGs it back to back over the protocol port, first with no
dashboard, then with ``--dashboards`` of them polling as the pages do (each, once a
second: the overview with its chart's new rows, the runs list, and the run's page with
its mailboxes and groups, one request after another, a connection each), in a process of
their own so they do not share the bystander's loop. Prints the PING latency's p50 and
p99 (ms) in each phase and the dashboards' answered requests.

    .venv/bin/python -m bench.dashboard_bystander [--dashboards 10] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import tempfile
import time
from pathlib import Path

from bench.harness import start_rsd, stop_rsd
from rsclient import AsyncRunstate


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _get(port: int, path: str) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 5.0)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
    return answer.startswith(b"HTTP/1.1 200 ")


def _polls(run: str) -> tuple[str, ...]:
    """What one dashboard asks each second: the three pages' requests (app.js)."""
    return ("/api/overview", "/api/history?after=0", "/api/runs?newest_first=1",
            f"/api/runs/{run}?tasks_limit=50", f"/api/runs/{run}/mailboxes",
            f"/api/runs/{run}/groups")


async def _dashboards(port: int, count: int, run: str, seconds: float) -> int:
    answered = [0]

    async def one() -> None:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            began = time.monotonic()
            for path in _polls(run):
                ok = await _get(port, path)
                answered[0] += ok
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    await asyncio.gather(*(one() for _ in range(count)))
    return answered[0]


def _dashboards_process(port: int, count: int, run: str, seconds: float,
                        out: multiprocessing.Queue[int]) -> None:
    out.put(asyncio.run(_dashboards(port, count, run, seconds)))


async def _pings(rs: AsyncRunstate, seconds: float) -> list[float]:
    took = []
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        began = time.perf_counter()
        await rs.ping()
        took.append((time.perf_counter() - began) * 1000)
    return sorted(took)


def _quantile(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


async def measure(dashboards: int, seconds: float) -> dict[str, object]:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as data:
        server = await start_rsd(Path(data), "--http-listen", f"127.0.0.1:{port}")
        try:
            async with AsyncRunstate("bystander", server.address) as rs:
                run = await rs.scopes.create()
                for n in range(50):
                    await run.claim(f"k{n}").try_acquire()
                await rs.mailboxes.ensure("jobs", mode="WORK", max_attempts=1)
                for n in range(500):
                    await run.mailbox("jobs").submit({"n": n}, group=f"g{n % 20}")
                for _ in range(20):
                    got = await run.mailbox("jobs").receive()
                    assert got is not None
                    await got.reject("a dead letter for the page")
                alone = await _pings(rs, seconds)
                out: multiprocessing.Queue[int] = multiprocessing.Queue()
                polling = multiprocessing.Process(
                    target=_dashboards_process, args=(port, dashboards, run.id, seconds + 1, out))
                polling.start()
                await asyncio.sleep(0.5)
                beside = await _pings(rs, seconds)
                answered = await asyncio.to_thread(out.get)
                polling.join()
        finally:
            await stop_rsd(server.proc)
    return {
        "dashboards": dashboards, "seconds": seconds,
        "alone_ms": {"p50": _quantile(alone, 0.5), "p99": _quantile(alone, 0.99),
                     "pings": len(alone)},
        "polled_ms": {"p50": _quantile(beside, 0.5), "p99": _quantile(beside, 0.99),
                      "pings": len(beside)},
        "dashboard_requests_answered": answered,
        "dashboard_requests_made": dashboards * len(_polls("r")) * int(seconds + 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dashboards", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.dashboards, args.seconds))))


if __name__ == "__main__":
    main()
