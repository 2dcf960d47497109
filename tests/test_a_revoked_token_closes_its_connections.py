"""A SIGHUP that removes a token, or gives it another tenant or role, closes the
connections that token opened, with a connection-level UNAUTHENTICATED ("the token of
this connection was revoked"); connections of the tokens left as they were carry on. The
SDK takes it as final: it raises AuthenticationError and never reconnects with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, AuthenticationError
from rsd.security.tokens import hash_token, new_token
from rsproto import ErrorCode, Op

RawConnect = Callable[..., Awaitable[Any]]
GONE, CHANGED, KEPT = new_token(), new_token(), new_token()


async def test_a_removed_or_changed_token_closes_its_connections_and_no_other(
    rsds: Callable[..., Rsd], raw_connect: RawConnect, eventually: Any
) -> None:
    server = rsds()
    tokens = server.write_tokens(
        f"{hash_token(GONE)} acme client", f"{hash_token(CHANGED)} beta client",
        f"{hash_token(KEPT)} ops admin",
    )
    await server.start("--tokens-file", str(tokens))
    changed, kept = await raw_connect(server.address), await raw_connect(server.address)
    await changed.hello(token=CHANGED)
    await kept.hello(token=KEPT)
    gone = AsyncRunstate("gone", server.address, token=GONE)
    run = await gone.scopes.create()
    await run.claim("k", lease_seconds=5).acquire()

    server.write_tokens(f"{hash_token(CHANGED)} beta admin", f"{hash_token(KEPT)} ops admin")
    server.hup()
    before, message = await changed.closed_with(ErrorCode.UNAUTHENTICATED)
    assert before == [] and message == "the token of this connection was revoked"

    async def cut() -> bool:
        return not gone._conn.connected

    await eventually(cut)
    for _ in range(3):  # final: raised at once, no HELLO sent again
        with pytest.raises(AuthenticationError, match="revoked"):
            await gone.ping()
    assert "time" in await kept.ok(Op.PING, {})
    stats = (await kept.ok(Op.SERVER_STATS, {}))["auth"]
    assert stats["revoked"] == 2 and stats["failures"] == 0  # the SDK did not come back
    assert "2 connections closed, their token was removed or changed" in server.log()
    await gone.close()
    assert await server.stop() == 0
