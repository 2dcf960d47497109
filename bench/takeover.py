"""Takeover: a holder process is killed (SIGKILL) while a waiter queues for its claim;
the time from the kill to the waiter's grant.

rsd keeps a lease after its connection dies (a network blip must not hand the key to
someone else), so the waiter is granted when the dead holder's lease runs out: this
figure is bounded by the lease length (``LEASE_SECONDS``, rsd's minimum) less the time
since the holder's last renewal. The Redis counterpart: the holder process took the lock
with ``SET NX PX`` of the same length; the waiter retries ``SET NX`` every
``REDIS_POLL_SECONDS`` (Redis has no line of waiters), so it gets the lock once the key
expires, plus up to one poll.

With ``release_on_disconnect`` (``fast_takeovers``) the holder's lease ends the moment
its connection closes, which the kernel does as it reaps the killed process: the figure
is then the time for rsd to see the close and grant the waiter, in milliseconds.

    python -m bench.takeover --role holder ADDRESS SCOPE [--release-on-disconnect]
    python -m bench.takeover --role redis-holder PORT      (what the harness starts)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from rsclient import AsyncRunstate

__all__ = [
    "LEASE_SECONDS", "REDIS_POLL_SECONDS", "fast_takeovers", "redis_takeover", "takeover",
]

LEASE_SECONDS = 5
REDIS_POLL_SECONDS = 0.01
KEY = "bench-takeover"


async def _start_holder(*argv: str) -> asyncio.subprocess.Process:
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.takeover", "--role", *argv, stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None
    if (await holder.stdout.readline()).strip() != b"HELD":
        holder.kill()
        await holder.wait()
        raise RuntimeError("the holder process did not take the lock")
    return holder


async def redis_takeover(port: int) -> float:
    """Seconds from SIGKILL of a Redis lock's holder process to a polling waiter's lock."""
    import redis.asyncio as redis

    holder = await _start_holder("redis-holder", str(port))
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        killed = time.perf_counter()
        os.kill(holder.pid, signal.SIGKILL)
        while not await client.set(KEY, "waiter", nx=True, px=LEASE_SECONDS * 1000):
            await asyncio.sleep(REDIS_POLL_SECONDS)
        return time.perf_counter() - killed
    finally:
        await client.aclose()
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


async def fast_takeovers(address: str, count: int) -> list[float]:
    """``count`` takeovers of a claim held with ``release_on_disconnect``: seconds from
    each SIGKILL of its holder process to the waiter's grant."""
    return [await takeover(address, release_on_disconnect=True) for _ in range(count)]


async def takeover(address: str, *, release_on_disconnect: bool = False) -> float:
    """Seconds from SIGKILL of the holder process to the waiter's grant."""
    async with AsyncRunstate(holder="bench-waiter", address=address) as rs:
        run = await rs.scopes.create()
        flag = ("--release-on-disconnect",) if release_on_disconnect else ()
        holder = await _start_holder("holder", address, run.id, *flag)
        try:
            claim = run.claim(KEY, lease_seconds=LEASE_SECONDS)
            waiting = asyncio.ensure_future(claim.acquire(wait=True, timeout_ms=60_000))
            while (await claim.inspect())["waiters"] == 0:
                await asyncio.sleep(0.001)
            killed = time.perf_counter()
            os.kill(holder.pid, signal.SIGKILL)
            lease = await waiting
            took = time.perf_counter() - killed
            await lease.release()
            return took
        finally:
            if holder.returncode is None:
                holder.kill()
            await holder.wait()


async def _hold(address: str, scope: str, release_on_disconnect: bool) -> None:
    async with AsyncRunstate(holder="bench-doomed-holder", address=address) as rs:
        await rs.scope(scope).claim(
            KEY, lease_seconds=LEASE_SECONDS, release_on_disconnect=release_on_disconnect
        ).acquire()
        print("HELD", flush=True)
        await asyncio.Event().wait()


async def _hold_redis(port: int) -> None:
    import redis.asyncio as redis

    client = redis.Redis(host="127.0.0.1", port=port)
    if not await client.set(KEY, "holder", nx=True, px=LEASE_SECONDS * 1000):
        raise SystemExit("the Redis lock was taken")
    print("HELD", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__" and sys.argv[1:3] == ["--role", "holder"]:
    asyncio.run(_hold(sys.argv[3], sys.argv[4], "--release-on-disconnect" in sys.argv[5:]))
elif __name__ == "__main__" and sys.argv[1:3] == ["--role", "redis-holder"]:
    asyncio.run(_hold_redis(int(sys.argv[3])))
