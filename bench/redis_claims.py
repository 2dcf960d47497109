"""The Redis lock a user would write instead of an rsd claim, through redis-py asyncio.

Acquire is ``SET key token NX PX ttl``; release is the usual Lua compare-and-delete
(delete the key only if it still holds our token), so a late release never frees a
lock someone else took after our lease ran out. The token is unique per acquire.
``claims`` is the counterpart of ``bench.claims.throughput``: C coroutines on one client
(redis-py's pool, up to a connection per coroutine), each looping
acquire + release on its own key; ``hold_keys`` fills Redis with N held locks for the
state figures.

``claims(..., processes=P)`` spreads the C coroutines over P client processes forked
from one launcher (``python -m bench.redis_claims PORT CONCURRENCY PROCESSES``, which
says READY once every client has connected, reads the window on stdin and prints each
pair's duration): redis-py spends 170-200 us of CPU per pair, so one client process is
the peer's limit and a second core is its best shape (``PROCESSES``, issue 33).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from multiprocessing.queues import Queue

from bench.harness import forked_clients, launched_clients

__all__ = ["PROCESSES", "RELEASE", "claims", "hold_keys"]

PROCESSES = 2
"""Client processes of the claim rows' Redis peer: its best shape on two cores."""

RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


async def claims(
    port: int, concurrency: int, seconds: float, samples: list[float] | None = None,
    processes: int = 1,
) -> float:
    """Acquire+release pairs/s; each pair's duration (s) goes into ``samples`` if given.
    ``processes`` > 1: the coroutines spread over that many forked client processes."""
    if processes > 1:
        return await _forked(port, concurrency, seconds, samples, processes)
    return await _loops(port, concurrency, seconds, samples, prefix="")


async def _loops(port: int, concurrency: int, seconds: float, samples: list[float] | None,
                 prefix: str, start_at: float | None = None) -> float:
    """``concurrency`` acquire+release loops on one redis-py client, from ``start_at``
    (a wall-clock time; now if None) for ``seconds``: pairs/s."""
    import redis.asyncio as redis

    client = redis.Redis(host="127.0.0.1", port=port, max_connections=concurrency)
    try:
        release = client.register_script(RELEASE)
        await client.ping()
        counts = [0] * concurrency
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        stop_at = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            key = f"key-{prefix}{i}"
            clock = time.perf_counter
            while (began := clock()) < stop_at:
                token = f"{i}:{counts[i]}"
                if not await client.set(key, token, nx=True, px=30_000):
                    raise RuntimeError(f"redis refused the free lock {key}")
                if await release(keys=[key], args=[token]) != 1:
                    raise RuntimeError(f"redis did not release {key}")
                counts[i] += 1
                if samples is not None:
                    samples.append(clock() - began)

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return sum(counts) / (time.perf_counter() - started)
    finally:
        await client.aclose()


async def _forked(port: int, concurrency: int, seconds: float, samples: list[float] | None,
                  processes: int) -> float:
    out = await launched_clients(
        "bench.redis_claims", [str(port), str(concurrency), str(processes)],
        lambda start: f"{start} {seconds}\n", "redis")
    result = json.loads(out)
    if samples is not None:
        samples.extend(result["samples"])
    return float(result["rate"])


def _client(port: int, concurrency: int, ready: Queue[None],
            window: Queue[tuple[float, float]], results: Queue[tuple[float, list[float]]]
            ) -> None:
    """One forked client process: its loops connect, it says so, then they run in the
    window; (pairs/s, pair durations) go back."""
    import uvloop

    async def run() -> tuple[float, list[float]]:
        import redis.asyncio as redis

        probe = redis.Redis(host="127.0.0.1", port=port)
        await probe.ping()
        await probe.aclose()
        ready.put(None)
        start, seconds = window.get()
        durations: list[float] = []
        rate = await _loops(port, concurrency, seconds, durations, prefix=f"{os.getpid()}-",
                            start_at=start)
        return rate, durations

    results.put(uvloop.run(run()))


def _launch(port: int, concurrency: int, processes: int) -> None:
    """Fork ``processes`` clients sharing ``concurrency`` loops, print READY once all are
    connected, read the window (start time, seconds) on stdin, print JSON of the pairs/s
    of all of them and every pair's duration."""
    import redis.asyncio  # noqa: F401  (imported once, before the fork)

    shares = [concurrency // processes + (i < concurrency % processes)
              for i in range(processes)]
    done: list[tuple[float, list[float]]] = forked_clients(
        _client, [(port, share) for share in shares if share], "a redis client process")
    print(json.dumps({"rate": sum(rate for rate, _ in done),
                      "samples": [d for _, durations in done for d in durations]}))


async def hold_keys(port: int, count: int) -> None:
    """Take ``count`` locks (10-minute TTL) that stay held, in pipelines of 4,096."""
    import redis.asyncio as redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for at in range(0, count, 4096):
            pipe = client.pipeline(transaction=False)
            for i in range(at, min(count, at + 4096)):
                pipe.set(f"held-{i}", f"token-{i}", nx=True, px=600_000)
            await pipe.execute()
    finally:
        await client.aclose()


if __name__ == "__main__":
    _launch(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
