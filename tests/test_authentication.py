"""Only a HELLO with a valid token is served, as its token's tenant and role.

With ``--tokens-file``: a missing, wrong, non-string or oversized token gets UNAUTHENTICATED
for the HELLO, then a connection-level UNAUTHENTICATED, then end-of-stream, and nothing
pipelined after it runs; failures are logged with the peer address (never the token), one
line per interval; SIGHUP reloads the file. Without one, rsd listens on loopback only
unless told ``--insecure``. The SDK sends ``token=`` (or ``$RUNSTATE_TOKEN``), and a refused
token raises AuthenticationError at once and is never retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.process import REPO, Rsd, subprocess_env

from rsclient import AsyncRunstate, AuthenticationError
from rsd.security.tokens import hash_token, new_token
from rsproto import PROTOCOL_VERSION, ErrorCode, Kind, Op

RawConnect = Callable[..., Awaitable[Any]]
ACME, OPS = new_token(), new_token()


async def started_with_tokens(make: Callable[..., Rsd], *lines: str) -> Rsd:
    server = make()
    tokens = server.write_tokens(
        "# tenants of this test", f"{hash_token(ACME)} acme client",
        f"{hash_token(OPS)} ops admin", *lines,
    )
    await server.start("--tokens-file", str(tokens))
    return server


def hello(token: Any) -> dict[str, Any]:
    return {"version": PROTOCOL_VERSION, "holder": "h", "token": token}


async def refused_hello(raw_connect: RawConnect, server: Rsd, args: dict[str, Any]) -> str:
    """Send HELLO (and a PING pipelined behind it); it must be refused as the protocol says:
    UNAUTHENTICATED for the HELLO, the connection-level one, end-of-stream, no PING reply."""
    raw = await raw_connect(server.address)
    rid, frame = raw.frame(Op.HELLO, args)
    _, ping = raw.frame(Op.PING, {})
    await raw.send(frame + ping)
    before, last = await raw.closed_with(ErrorCode.UNAUTHENTICATED)
    assert last == "handshake failed"
    assert len(before) == 1, f"only the HELLO is answered: {before!r}"
    kind, answered, code, message, _ = before[0]
    assert (kind, answered, code) == (Kind.ERROR, rid, ErrorCode.UNAUTHENTICATED)
    return message


async def test_a_valid_token_is_served_as_its_tenant_and_role(
    rsds: Callable[..., Rsd], raw_connect: RawConnect, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await started_with_tokens(rsds)
    raw = await raw_connect(server.address)
    reply = await raw.hello(token=ACME)
    assert (reply["tenant"], reply["role"]) == ("acme", "client")
    assert "time" in await raw.ok(Op.PING, {})
    async with AsyncRunstate("sdk", server.address, token=OPS) as rs:
        assert rs._conn.server_info["tenant"] == "ops"
        assert rs._conn.server_info["role"] == "admin"
        run = await rs.scopes.create()
        async with run.claim("k") as lease:
            assert lease.generation >= 1
    monkeypatch.setenv("RUNSTATE_TOKEN", ACME)
    async with AsyncRunstate("from-env", server.address) as rs:
        assert rs._conn.server_info["tenant"] == "acme"
    assert await server.stop() == 0


async def test_missing_wrong_and_junk_tokens_are_refused_then_closed(
    rsds: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    server = await started_with_tokens(rsds)
    junk = "x" * 100_000
    cases: list[tuple[dict[str, Any], str]] = [
        ({"version": PROTOCOL_VERSION, "holder": "h"}, "requires a token"),
        (hello(None), "requires a token"),
        (hello("rsd_not-a-token-of-this-server"), "the token is not valid"),
        (hello(12345), "token must be a string, got int"),
        (hello(junk), "token must be 1 to 256 bytes"),
        (hello(junk.encode()), "token must be a string, got bytes"),
        (hello({"nested": [1, 2]}), "token must be a string, got dict"),
    ]
    for args, complaint in cases:
        message = await refused_hello(raw_connect, server, args)
        assert complaint in message, (args.get("token"), message)
    log = server.log()
    assert log.count("authentication failed from 127.0.0.1:") == 1  # the rest: one summary
    assert "summed up in one line" in log
    assert "rsd_not-a-token" not in log and "xxxxxxxx" not in log
    async with AsyncRunstate("admin", server.address, token=OPS) as rs:
        stats = (await rs.server_stats())["auth"]
    assert stats["failures"] == len(cases) and stats["required"] and stats["entries"] == 2
    assert await server.stop() == 0


async def test_sighup_reloads_the_tokens_file_and_keeps_connections_of_kept_tokens(
    rsds: Callable[..., Rsd], raw_connect: RawConnect, eventually: Any
) -> None:
    server = await started_with_tokens(rsds)
    kept = await raw_connect(server.address)
    await kept.hello(token=OPS)
    added = new_token()
    server.write_tokens(f"{hash_token(added)} newcomer client", f"{hash_token(OPS)} ops admin")
    server.hup()

    async def reloaded() -> bool:
        return "tokens file" in server.log() and "reloaded: 2 entries" in server.log()

    await eventually(reloaded)
    fresh = await raw_connect(server.address)
    assert (await fresh.hello(token=added))["tenant"] == "newcomer"
    assert "not valid" in await refused_hello(raw_connect, server, hello(ACME))
    assert "time" in await kept.ok(Op.PING, {})  # a token kept as it was: still served
    assert "scope" in await kept.ok(Op.SCOPE_CREATE, {})

    server.write_tokens(f"{hash_token(OPS)} ops admin", "this line is broken")
    server.hup()

    async def kept_old() -> bool:
        return "not reloaded, keeping the 2 entries in use" in server.log()

    await eventually(kept_old)
    assert f"{server.root / 'tokens'}:2:" in server.log()
    again = await raw_connect(server.address)
    assert (await again.hello(token=added))["tenant"] == "newcomer"
    assert await server.stop() == 0


async def test_a_refused_token_raises_at_once_and_is_never_retried(
    rsds: Callable[..., Rsd],
) -> None:
    server = await started_with_tokens(rsds)
    client = AsyncRunstate("wrong", server.address, token="rsd_wrong", connect_timeout=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AuthenticationError) as caught:
        await client.ping()
    assert caught.value.code == ErrorCode.UNAUTHENTICATED
    assert "not valid" in caught.value.message
    for _ in range(3):  # no backoff, no second attempt on the server
        with pytest.raises(AuthenticationError):
            await client.scopes.create()
    assert loop.time() - started < 5
    await client.close()
    async with AsyncRunstate("admin", server.address, token=OPS) as rs:
        assert (await rs.server_stats())["auth"]["failures"] == 1
    assert await server.stop() == 0


async def test_without_a_tokens_file_every_client_is_the_default_admin(
    rsd: Rsd, raw_connect: RawConnect
) -> None:
    raw = await raw_connect(rsd.address)
    reply = await raw.hello(token=12345)  # ignored: this server authenticates nobody
    assert (reply["tenant"], reply["role"]) == ("default", "admin")


async def test_a_non_loopback_listen_needs_a_tokens_file_or_insecure(
    rsds: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    exposed = Rsd(rsds().root.parent / "exposed", listen_host="0.0.0.0")
    assert await exposed.refused() == 2
    said = exposed.log()
    assert "not a loopback address" in said and "--tokens-file" in said and "--insecure" in said
    await exposed.start("--insecure")
    assert "INSECURE: no authentication" in exposed.log()
    raw = await raw_connect(f"127.0.0.1:{exposed.port}")
    assert (await raw.hello())["tenant"] == "default"
    assert await exposed.stop() == 0
    tokens = exposed.write_tokens(f"{hash_token(ACME)} acme client")
    exposed.port = 0
    await exposed.start("--tokens-file", str(tokens))
    assert "INSECURE" not in exposed.log()
    assert await exposed.stop() == 0


async def test_a_bad_tokens_file_refuses_to_start_naming_file_and_line(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    tokens = server.write_tokens("# fine", ACME + " acme client")  # a token in clear
    assert await server.refused("--tokens-file", str(tokens)) == 2
    assert f"{tokens}:2: expected 'sha256:'" in server.log()
    assert "looks like a token in clear" in server.log()


def test_token_new_prints_a_token_and_the_line_to_add() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rsd", "token", "new", "acme", "client"],
        capture_output=True, text=True, cwd=REPO, env=subprocess_env(), check=True,
    )
    lines = done.stdout.splitlines()
    token = lines[0].removeprefix("token: ")
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert lines[-1] == f"sha256:{digest} acme client"
    assert token.startswith("rsd_") and len(token) == 47
    bad = subprocess.run(
        [sys.executable, "-m", "rsd", "token", "new", "acme", "root"],
        capture_output=True, text=True, cwd=REPO, env=subprocess_env(),
    )
    assert bad.returncode == 2 and "role must be admin or client" in bad.stderr
