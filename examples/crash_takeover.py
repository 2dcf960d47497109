"""Crash takeover: a worker takes a task and goes silent; when its lease expires the task
comes back with attempt + 1, another worker completes it, and the first worker's late
result is refused (LeaseLostError, STALE_CLAIM). Takes about 5 s (the shortest lease).

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/crash_takeover.py
"""

import asyncio

from rsclient import AsyncRunstate, LeaseLostError


async def main() -> None:
    async with AsyncRunstate(holder="crashy") as crashy, AsyncRunstate(holder="steady") as steady:
        await steady.mailboxes.ensure("research")
        run = await steady.scopes.create()
        ticket = await run.mailbox("research").submit({"company": "acme"}, key="research:acme")

        # receive() is not renewed for you: a worker that stops renewing looks dead.
        first = await crashy.scope(run.id).mailbox("research").receive(lease_seconds=5)
        assert first is not None
        print("crashy got attempt", first.attempt, "and stops renewing")

        second = await run.mailbox("research").receive(wait=True, timeout_ms=15_000)
        assert second is not None
        print("steady got attempt", second.attempt, "after the lease expired")
        await second.complete(result={"payload": "steady's report"})

        try:
            await first.complete(result={"payload": "crashy's late report"})
        except LeaseLostError as exc:
            print("crashy's late result refused:", exc.code)

        outcome = await ticket.result(timeout_ms=5_000)
        print("recorded:", outcome["state"], outcome["outcome"])


if __name__ == "__main__":
    asyncio.run(main())
