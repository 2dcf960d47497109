"""Receiving manually: one delivery, renewed before long work, settled yourself.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/manual_receive.py
"""

import asyncio

from rsclient import AsyncRunstate


async def research_company(name: str) -> dict[str, str]:
    await asyncio.sleep(0.05)
    return {"summary": f"{name} makes anvils"}


async def main() -> None:
    async with AsyncRunstate(holder="manual-worker") as rs:
        await rs.mailboxes.ensure("research")
        run = await rs.scopes.create()
        ticket = await run.mailbox("research").submit({"company": "acme"}, key="research:acme")

        delivery = await run.mailbox("research").receive()
        if delivery is not None:
            try:
                await delivery.renew(120)  # extend before long work
                report = await research_company(delivery.data["company"])
                await delivery.complete(result={"payload": report})
            except Exception:
                await delivery.retry()
                raise
        print("the queue is now empty:", await run.mailbox("research").receive() is None)
        print("result:", (await ticket.result(timeout_ms=5_000))["outcome"])


if __name__ == "__main__":
    asyncio.run(main())
