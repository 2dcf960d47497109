"""A wrong token past its address's allowance is still told as a wrong token (issue 30).

After 10 failed HELLOs from an address rsd slows its wrong tokens down, up to 5 s each;
a client whose HELLO answer waited longer than its connect timeout (2 s by default) saw
``UNAVAILABLE ... timed out``, so a crash-looping worker with a bad token logged a
network failure. rsd answers a slowed refusal within 0.5 s (refusals.py), keeping the
refusal's place for its whole delay, so the client raises AuthenticationError
(UNAUTHENTICATED), with its default options. The refusal's rules themselves are tested
on a fake clock (test_held_refusals_wait_their_moment_within_bounds.py); this one needs
the real server and SDK: the answer against the SDK's own bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, AuthenticationError
from rsclient.connection import DEFAULT_CONNECT_TIMEOUT
from rsd.security.tokens import hash_token, new_token
from rsproto import ErrorCode


async def refused(
    address: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> AuthenticationError:
    """The AuthenticationError a client with a wrong token raises (any other: a failure)."""
    client = AsyncRunstate("worker", address, token="rsd_not_a_token",
                           connect_timeout=connect_timeout)
    try:
        with pytest.raises(AuthenticationError) as failed:
            await client.ping()
        return failed.value
    finally:
        await client.close()


async def test_a_bad_token_after_many_bad_attempts_raises_authentication_error(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    tokens = server.write_tokens(f"{hash_token(new_token())} acme client")
    await server.start("--tokens-file", str(tokens))
    # 20 bad attempts at once from this address: 10 within its allowance, 10 slowed
    # down, the last ones by 5 s (these clients wait as long as it takes).
    await asyncio.gather(*(refused(server.address, connect_timeout=30) for _ in range(20)))
    failure = await refused(server.address)  # the defaults: a 2 s connect timeout
    assert failure.code == ErrorCode.UNAUTHENTICATED
    assert "not valid" in failure.message, failure.message
    assert await server.stop() == 0
