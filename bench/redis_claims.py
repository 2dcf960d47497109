"""The Redis lock a user would write instead of an rsd claim, through redis-py asyncio.

Acquire is ``SET key token NX PX ttl``; release is the usual Lua compare-and-delete
(delete the key only if it still holds our token), so a late release never frees a
lock someone else took after our lease ran out. The token is unique per acquire.
``claims`` is the counterpart of ``bench.claims.throughput``: C coroutines on one client
(redis-py's pool, up to a connection per coroutine), each looping
acquire + release on its own key; ``hold_keys`` fills Redis with N held locks for the
state figures.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["RELEASE", "claims", "hold_keys"]

RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


async def claims(
    port: int, concurrency: int, seconds: float, samples: list[float] | None = None
) -> float:
    """Acquire+release pairs/s; each pair's duration (s) goes into ``samples`` if given."""
    import redis.asyncio as redis

    client = redis.Redis(host="127.0.0.1", port=port, max_connections=concurrency)
    try:
        release = client.register_script(RELEASE)
        await client.ping()
        counts = [0] * concurrency
        stop_at = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            key = f"key-{i}"
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
