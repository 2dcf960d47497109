"""Over a real rsd with a tokens file: another tenant's objects do not exist for you.

The core's rules are tested one by one in test_core_tenants.py; this is the same promise
end to end, through authentication: each token's tenant sees only its own runs, claims,
tasks, mailboxes and leases; a client token is refused the admin-only SERVER_STATS with
PERMISSION_DENIED, an admin token is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsclient import AsyncRunstate, NotFoundError, PermissionDeniedError
from rsd.security.tokens import hash_token, new_token
from rsproto import ErrorCode, Op

RawConnect = Callable[..., Awaitable[Any]]
ACME, GLOBEX, OPS = new_token(), new_token(), new_token()


async def test_a_tenant_sees_none_of_another_tenants_objects(
    rsds: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    server = rsds()
    tokens = server.write_tokens(
        f"{hash_token(ACME)} acme client",
        f"{hash_token(GLOBEX)} globex client",
        f"{hash_token(OPS)} ops admin",
    )
    await server.start("--tokens-file", str(tokens))
    async with (
        AsyncRunstate("acme-1", server.address, token=ACME) as acme,
        AsyncRunstate("globex-1", server.address, token=GLOBEX) as globex,
    ):
        run = await acme.scopes.create()
        await acme.mailboxes.ensure("jobs", mode="WORK")
        ticket = await run.mailbox("jobs").submit({"n": 1}, key="job-1")
        held = await run.claim("k").try_acquire()
        assert held["kind"] == "acquired"
        lease = held["lease"]

        # The same run id is, for globex, a run it never created: NOT_FOUND, as for any
        # made-up id. Globex may create its own run of that id; its key is free there.
        code, _ = await _not_found(globex.scope(run.id).claim("k").try_acquire())
        assert code == ErrorCode.NOT_FOUND
        theirs = await globex.scopes.create(id=run.id)
        assert theirs.created is True
        other = await theirs.claim("k").try_acquire()
        assert other["kind"] == "acquired"
        await other["lease"].release()

        # acme's task and mailbox: NOT_FOUND, exactly as for ones that never existed.
        missing_task = await _not_found(globex.scope(run.id).task(ticket.id).status())
        await globex.mailboxes.ensure("other", mode="WORK")
        never_task = await _not_found(globex.scope(run.id).task("0").status())
        assert missing_task[0] == never_task[0] == ErrorCode.NOT_FOUND
        code, _ = await _not_found(theirs.mailbox("jobs").receive())
        assert code == ErrorCode.NOT_FOUND

        # acme's lease handle from a globex connection: STALE_CLAIM, and acme still holds.
        raw = await raw_connect(server.address)
        await raw.hello(token=GLOBEX)
        handle = lease.handle
        code, _, _ = await raw.error(Op.CLAIM_RELEASE, {"lease": handle})
        assert code == ErrorCode.STALE_CLAIM
        results = (await raw.ok(Op.LEASE_RENEW, {"leases": [handle]}))["results"]
        assert results == [ErrorCode.STALE_CLAIM.value]
        view = await run.claim("k").inspect()
        assert view["held"] and view["generation"] == lease.generation
        assert not lease.is_lost

        # Admin-only: a client token is refused, an admin token is served.
        try:
            await globex.server_stats()
        except PermissionDeniedError as exc:
            assert exc.code == ErrorCode.PERMISSION_DENIED
        else:
            raise AssertionError("a client token was served SERVER_STATS")
        async with AsyncRunstate("ops-1", server.address, token=OPS) as ops:
            stats = await ops.server_stats()
            assert stats["core"]["tenants"] >= 2
        await lease.release()
    assert await server.stop() == 0


async def _not_found(call: Awaitable[Any]) -> tuple[str, str]:
    try:
        await call
    except NotFoundError as exc:
        return exc.code, str(exc)
    raise AssertionError("expected NOT_FOUND")
