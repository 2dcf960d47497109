"""A wrong bearer token's 401 waits as a wrong HELLO token's refusal does (longer with
every failure from that address, up to ratelimit.MAX_DELAY, 5 s), but it is written
before the listener's deadline cuts the connection off: the client learns its token is
wrong, it does not see a dropped connection. Before: a refusal held past the deadline
(5 s, as the longest wait) was never written, and the connection ended with no answer.

Real time, in-process (support/site.py) with a 1 s deadline: what is tested is the
meeting of two loop timers, the refusal's and the connection's deadline.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support.site import Site, exchange

from rsd.security.auth import Refusal
from rsd.security.ratelimit import MAX_DELAY
from rsd.security.tokens import hash_token, new_token

DEADLINE = 1.0


async def test_a_wrong_token_held_past_the_deadline_still_gets_its_401(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{hash_token(new_token())} ops admin\n")
    site = await Site.start(tokens, deadline=DEADLINE)
    try:
        now = asyncio.get_running_loop().time()
        delay = 0.0
        while delay < MAX_DELAY:  # this address fails often: its next refusal waits 5 s
            refusal = site.auth.authenticate("wrong", None, "127.0.0.1", "127.0.0.1", now)
            assert isinstance(refusal, Refusal)
            delay = refusal.delay
        request = (b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Authorization: Bearer " + new_token().encode() + b"\r\n\r\n")
        status, body = await exchange(site.port, request)
        assert status == 401
        assert json.loads(body)["error"] == "UNAUTHENTICATED"
    finally:
        site.close()
