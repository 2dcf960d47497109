"""Hold one claim in a process of its own, for tests that kill or pause its holder.

    python holder.py ADDRESS SCOPE KEY [--lease-seconds 5] [--holder NAME] [--pool]
                     [--release-on-disconnect] [--say-renewed]

With ``--pool`` KEY names a pool and the process holds one of its slots instead; with
``--release-on-disconnect`` the lease ends with the process's connection.

Prints one flushed line per event on stdout, then exits 0:

    ACQUIRED <generation> <token>      the lease is held; the SDK keeps renewing it
    RENEWED <sent_at>                  (--say-renewed) its first renewal is confirmed: the
                                       monotonic clock when it was sent (the server ends
                                       the lease no earlier than a lease after that)
    LOST <is_lost>                     the SDK declared the lease lost
    RELEASE ok                         the release after the loss went through, or
    RELEASE <ExceptionClass> <code>    it raised (LeaseLostError STALE_CLAIM is right)

Until the lease is lost it just waits, so SIGKILL leaves it held and SIGSTOP lets it
expire. Anything unexpected goes to stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rsclient import AsyncRunstate, RunstateError
from rsproto.sdkrules import loss_margin


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("scope")
    parser.add_argument("key")
    parser.add_argument("--lease-seconds", type=float, default=5)
    parser.add_argument("--holder", default="holder-process")
    parser.add_argument("--pool", action="store_true")
    parser.add_argument("--release-on-disconnect", action="store_true")
    parser.add_argument("--say-renewed", action="store_true")
    args = parser.parse_args()

    async with AsyncRunstate(holder=args.holder, address=args.address) as rs:
        await rs.scopes.create(id=args.scope)  # runs must exist
        run = rs.scope(args.scope)
        get = run.pool if args.pool else run.claim
        held = get(
            args.key, lease_seconds=args.lease_seconds,
            release_on_disconnect=args.release_on_disconnect,
        )
        lease = await held.acquire()
        print(f"ACQUIRED {lease.generation} {lease.token()}", flush=True)
        if args.say_renewed:
            # The SDK's deadline moves on when a renewal is confirmed: it is the renewal's
            # send time plus the lease less the SDK's margin (rsproto.sdkrules).
            first = lease.lost_at
            while lease.lost_at == first and not lease.is_lost:
                await asyncio.sleep(0.01)
            sent_at = lease.lost_at - lease.lease_seconds + loss_margin(lease.lease_seconds)
            print(f"RENEWED {sent_at:.6f}", flush=True)
        await lease.lost_event.wait()
        print(f"LOST {lease.is_lost}", flush=True)
        try:
            await lease.release()
        except RunstateError as exc:
            print(f"RELEASE {type(exc).__name__} {exc.code}", flush=True)
        else:
            print("RELEASE ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
