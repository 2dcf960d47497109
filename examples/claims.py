"""Own a key with a claim: run() while held, a conflict, try_acquire, a `with` block.

    make run                                   # rsd on 127.0.0.1:7420
    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/claims.py
"""

import asyncio

from rsclient import AsyncRunstate, ConflictError, Lease


async def research_company(name: str) -> dict[str, str]:
    await asyncio.sleep(0.05)  # the real work
    return {"summary": f"{name} makes anvils"}


async def main() -> None:
    async with AsyncRunstate(holder="researcher-1") as rs:
        run = await rs.scopes.create()

        async def research(lease: Lease) -> dict[str, str]:
            print(f"researching acme as generation {lease.generation}")
            return await research_company("acme")

        report = await run.claim("company:acme").run(research, wait=True, timeout_ms=120_000)
        print("report:", report)

        # While one holder has the key, another is refused at once (CLAIM_HELD).
        async with AsyncRunstate(holder="researcher-2") as rival:
            lease = await run.claim("company:acme").acquire()
            try:
                await rival.scope(run.id).claim("company:acme").run(research)
            except ConflictError as exc:
                print("rival refused:", exc.code)
            attempt = await rival.scope(run.id).claim("company:acme").try_acquire()
            print("rival's try_acquire:", attempt["kind"])
            await lease.release()

        # A block under a lease; the token goes with your writes elsewhere.
        async with run.claim("file:report.md", lease_seconds=60) as lease:
            lease.raise_if_lost()
            print("writing report.md with fencing token", lease.token())


if __name__ == "__main__":
    asyncio.run(main())
