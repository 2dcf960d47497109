"""TLS carries the same protocol; with ``--tls-client-ca`` only certified clients get in.

Certificates come from a CA each test makes (support/certs.py). The SDK reaches a TLS
server through ``tls://HOST:PORT`` (system CAs, here pointed at the test CA through
``SSL_CERT_FILE``) or a ``tls=`` context; a plaintext client is never served by it. A
client certificate's CN may stand for a token (``cert:`` lines of the tokens file).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.certs import Certs
from support.process import Rsd

from rsclient import AsyncRunstate, AuthenticationError, UnavailableError
from rsd.security.tokens import hash_token, new_token
from rsproto import PROTOCOL_VERSION, ErrorCode, Op

RawConnect = Callable[..., Awaitable[Any]]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


async def test_tls_serves_the_same_protocol_to_tls_clients_only(
    rsds: Callable[..., Rsd], certs: Certs, raw_connect: RawConnect,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = rsds()
    await server.start(*certs.server_flags())
    async with AsyncRunstate("ctx", server.address, tls=certs.client_context()) as rs:
        run = await rs.scopes.create()
        async with run.claim("file:a", lease_seconds=5) as lease:
            assert not lease.is_lost
        assert (await rs.server_stats())["tls"] is True
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca_file))  # what tls:// trusts here
    async with AsyncRunstate("url", f"tls://{server.address}") as rs:
        assert "time" in await rs.ping()
    raw = await raw_connect(server.address, certs.client_context())
    assert (await raw.hello())["tenant"] == "default"

    plain = await raw_connect(server.address)  # plaintext frames are no TLS handshake
    await plain.request(Op.HELLO, {"version": PROTOCOL_VERSION, "holder": "plain"})
    answer = await asyncio.wait_for(plain.reader.read(), 5)  # to the close
    assert answer[:2] == b"\x15\x03"  # a TLS alert record, then the close (tls.py)
    monkeypatch.delenv("SSL_CERT_FILE")
    untrusting = AsyncRunstate(
        "untrusting", server.address, tls=ssl.create_default_context(), connect_timeout=0.5
    )
    with pytest.raises(UnavailableError, match="cannot be trusted"):
        await untrusting.ping()
    await untrusting.close()
    assert await server.stop() == 0


async def test_mutual_tls_refuses_clients_without_a_certificate(
    rsds: Callable[..., Rsd], certs: Certs, tmp_path: Path
) -> None:
    server = rsds()
    await server.start(*certs.mutual_flags())
    anonymous = AsyncRunstate(
        "anonymous", server.address, tls=certs.client_context(), connect_timeout=0.5
    )
    with pytest.raises(UnavailableError):
        await anonymous.ping()
    await anonymous.close()
    stranger_ca = Certs(tmp_path / "stranger")  # a certificate from a CA rsd does not trust
    foreign = stranger_ca.client_context("worker-a")
    foreign.load_verify_locations(str(certs.ca_file))
    stranger = AsyncRunstate("stranger", server.address, tls=foreign, connect_timeout=0.5)
    with pytest.raises(UnavailableError):
        await stranger.ping()
    await stranger.close()
    async with AsyncRunstate(
        "certified", server.address, tls=certs.client_context("worker-a")
    ) as rs:
        assert "time" in await rs.ping()
    assert "TLS handshake with 127.0.0.1" in server.log()
    assert await server.stop() == 0


async def test_a_client_certificate_maps_to_a_tenant_in_place_of_a_token(
    rsds: Callable[..., Rsd], certs: Certs, raw_connect: RawConnect
) -> None:
    server = rsds()
    token = new_token()
    tokens = server.write_tokens(
        "cert:worker-a acme client", f"{hash_token(token)} ops admin"
    )
    await server.start(*certs.mutual_flags(), "--tokens-file", str(tokens))
    mapped = await raw_connect(server.address, certs.client_context("worker-a"))
    reply = await mapped.hello()
    assert (reply["tenant"], reply["role"]) == ("acme", "client")
    with_token = await raw_connect(server.address, certs.client_context("worker-a"))
    assert (await with_token.hello(token=token))["tenant"] == "ops"  # a token decides
    unmapped = await raw_connect(server.address, certs.client_context("worker-b"))
    code, message, _ = await unmapped.error(
        Op.HELLO, {"version": PROTOCOL_VERSION, "holder": "b"}
    )
    assert code == ErrorCode.UNAUTHENTICATED and "'worker-b' is not mapped" in message
    client = AsyncRunstate("b", server.address, tls=certs.client_context("worker-b"))
    with pytest.raises(AuthenticationError):
        await client.ping()
    await client.close()
    assert await server.stop() == 0


async def test_connections_in_the_tls_handshake_count_against_the_limits(
    rsds: Callable[..., Rsd], certs: Certs
) -> None:
    server = rsds()
    await server.start(*certs.server_flags(), "--max-connections-per-peer", "2")
    host, _, port = server.address.rpartition(":")
    silent = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    reader, writer = await asyncio.open_connection(host, int(port))  # the third: closed
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    for _, idle in silent:
        idle.close()
    async with AsyncRunstate("after", server.address, tls=certs.client_context()) as rs:
        assert "time" in await rs.ping()  # the places are free again
    assert await server.stop() == 0
