"""Plain messages: send() without a task; the same work_key is sent once.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/plain_messages.py
"""

import asyncio

from rsclient import AsyncRunstate, ConflictError


async def main() -> None:
    async with AsyncRunstate(holder="crawler") as rs:
        await rs.mailboxes.ensure("crawl")
        run = await rs.scopes.create()
        box = run.mailbox("crawl")

        sent = await box.send({"company": "acme"}, work_key="crawl:acme")
        print(sent["id"], sent["replay"])
        again = await box.send({"company": "acme"}, work_key="crawl:acme")
        print(again["id"], again["replay"])  # the same message, replay=True
        try:
            await box.send({"company": "globex"}, work_key="crawl:acme")
        except ConflictError as exc:
            print("other data under the same work_key:", exc.code)

        delivery = await box.receive()
        assert delivery is not None
        print("received", delivery.kind, delivery.data)
        await delivery.complete()


if __name__ == "__main__":
    asyncio.run(main())
