"""Takeover: a holder process is killed (SIGKILL) while a waiter queues for its claim;
the time from the kill to the waiter's grant.

rsd keeps a lease after its connection dies (a network blip must not hand the key to
someone else), so the waiter is granted when the dead holder's lease runs out: this
figure is bounded by the lease length (``LEASE_SECONDS``, rsd's minimum) less the time
since the holder's last renewal.

    python -m bench.takeover --role holder ADDRESS SCOPE   (what the harness starts)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from rsclient import AsyncRunstate

__all__ = ["LEASE_SECONDS", "takeover"]

LEASE_SECONDS = 5
KEY = "bench-takeover"


async def takeover(address: str) -> float:
    """Seconds from SIGKILL of the holder process to the waiter's grant."""
    async with AsyncRunstate(holder="bench-waiter", address=address) as rs:
        run = await rs.scopes.create()
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.takeover", "--role", "holder", address, run.id,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            if (await holder.stdout.readline()).strip() != b"HELD":
                raise RuntimeError("the holder process did not take the claim")
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


async def _hold(address: str, scope: str) -> None:
    async with AsyncRunstate(holder="bench-doomed-holder", address=address) as rs:
        await rs.scope(scope).claim(KEY, lease_seconds=LEASE_SECONDS).acquire()
        print("HELD", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__" and sys.argv[1:3] == ["--role", "holder"]:
    asyncio.run(_hold(sys.argv[3], sys.argv[4]))
