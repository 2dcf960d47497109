"""Consume one mailbox in a process of its own, for tests that kill a worker mid-task.

    python worker.py ADDRESS SCOPE MAILBOX [--lease-seconds 5] [--holder NAME]
                     [--then hang|complete] [--release-on-disconnect]

Runs ``consume()`` (concurrency 1) and prints one flushed line per event on stdout:

    HANDLING <task_id> <attempt>      the handler has started on a delivery
    COMPLETED <task_id> <attempt>     (--then complete) it completed the delivery with
                                      the payload {"by": NAME, "attempt": <attempt>}

With ``--then hang`` (the default) the handler never returns, so the SDK keeps renewing
the lease until the process dies: SIGKILL leaves the task to the lease's expiry. With
``--then complete`` the worker stops consuming after its first completion and exits 0.
With ``--release-on-disconnect`` each delivery's lease ends with the process's
connection.
Anything unexpected goes to stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from rsclient import AsyncRunstate, Delivery


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("scope")
    parser.add_argument("mailbox")
    parser.add_argument("--lease-seconds", type=float, default=5)
    parser.add_argument("--holder", default="worker-process")
    parser.add_argument("--then", choices=["hang", "complete"], default="hang")
    parser.add_argument("--release-on-disconnect", action="store_true")
    args = parser.parse_args()

    stop = asyncio.Event()

    async def handle(data: Any, delivery: Delivery) -> None:
        print(f"HANDLING {delivery.task_id} {delivery.attempt}", flush=True)
        if args.then == "hang":
            await asyncio.Event().wait()
        payload = {"by": args.holder, "attempt": delivery.attempt}
        await delivery.complete(result={"payload": payload})
        print(f"COMPLETED {delivery.task_id} {delivery.attempt}", flush=True)
        stop.set()

    async with AsyncRunstate(holder=args.holder, address=args.address) as rs:
        await rs.scopes.create(id=args.scope)  # runs must exist
        await rs.scope(args.scope).mailbox(args.mailbox).consume(
            handle, lease_seconds=args.lease_seconds, stop_event=stop,
            release_on_disconnect=args.release_on_disconnect,
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
