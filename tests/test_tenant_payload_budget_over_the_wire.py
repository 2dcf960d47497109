"""A tenant's stored payload bytes have a limit on a real server, set in the tokens file.

A ``limit <tenant> max_payload_bytes_per_tenant=<bytes>`` line gives one tenant its own
limit; others have ``--max-payload-bytes-per-tenant``. A submit past it is refused with
RESOURCE_EXHAUSTED naming the limit and the usage; a restart rebuilds the same usage (the
same refusal, same figures), and SIGHUP applies a changed line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsd.security.tokens import hash_token, new_token
from rsproto import ErrorCode, Op

RawConnect = Callable[..., Awaitable[Any]]
ACME, OPS = new_token(), new_token()
BOX = {"scope": "s", "mailbox": "jobs"}
DATA = "x" * 100_000  # 100,005 bytes encoded
LIMIT = "max_payload_bytes_per_tenant"


def tokens(acme_limit: str) -> tuple[str, ...]:
    return (f"{hash_token(ACME)} acme client", f"{hash_token(OPS)} ops admin",
            f"limit acme {LIMIT}={acme_limit}")


async def connected(raw_connect: RawConnect, server: Rsd, token: str) -> Any:
    raw = await raw_connect(server.address)
    await raw.hello(token=token)
    return raw


async def test_a_tokens_file_limit_refuses_past_it_across_restarts_and_reloads(
    rsds: Callable[..., Rsd], raw_connect: RawConnect, eventually: Any
) -> None:
    server = rsds()
    path = server.write_tokens(*tokens("256KiB"))
    flags = ("--tokens-file", str(path), "--max-payload-bytes-per-tenant", str(1 << 20))
    await server.start(*flags)
    acme = await connected(raw_connect, server, ACME)
    ops = await connected(raw_connect, server, OPS)
    for raw in (acme, ops):
        await raw.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
        await raw.ok(Op.SCOPE_CREATE, {"scope": "s"})
        for _ in range(2):
            await raw.ok(Op.TASK_SUBMIT, {**BOX, "data": DATA})
    refusal = (ErrorCode.RESOURCE_EXHAUSTED, {"limit": LIMIT, "value": 256 << 10,
                                               "usage": 200_010})
    code, message, details = await acme.error(Op.TASK_SUBMIT, {**BOX, "data": DATA})
    assert (code, details) == refusal and LIMIT in message
    await ops.ok(Op.TASK_SUBMIT, {**BOX, "data": DATA})  # the flag's 1 MiB is ops' limit

    await server.restart(*flags)
    acme = await connected(raw_connect, server, ACME)
    code, _, details = await acme.error(Op.TASK_SUBMIT, {**BOX, "data": DATA})
    assert (code, details) == refusal  # the usage rebuilt from the journal, to the byte

    server.write_tokens(*tokens("512KiB"))
    server.hup()

    async def reloaded() -> bool:
        return f"{LIMIT} of 1 tenants" in server.log()

    await eventually(reloaded)
    await acme.ok(Op.TASK_SUBMIT, {**BOX, "data": DATA})
    assert await server.stop() == 0
    assert not server.tracebacks()
