"""Without a tokens file, rsd's HTTP listener answers only requests addressed to a
loopback name, on every path, /metrics included: a page of another site whose name was
made to resolve to 127.0.0.1 (DNS rebinding) sends its own name as Host and gets 403.
The Host header is parsed strictly, host[:port] with IPv6 in brackets: before,
``Host: localhost:80@evil.example`` passed the loopback check of /api/ (its text before
the last colon), and /metrics answered any Host at all. With a tokens file the listener
may serve a network, and /metrics answers whatever name it is reached by (docs/http.md).
In-process (support/site.py): the Host is decided before any core call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.site import Site, exchange

from rsd.security.tokens import hash_token, new_token


def get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


REFUSED_HOSTS = [
    "evil.example", "evil.example:80", "localhost:80@evil.example", "localhost@evil.example",
    "127.0.0.1.evil.example", "localhost:", "localhost:99999", "localhost:80:80", "[::1",
    "::1", "localhost/x", "user@localhost", "[::1]x", "local host",
]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
async def test_a_request_addressed_to_another_name_is_refused_on_every_path(host: str) -> None:
    site = await Site.start()
    try:
        status, body = await exchange(site.port, get("/metrics", host))
        assert status == 403 and b"rsd_up" not in body
        assert b"loopback name" in body
        status, body = await exchange(site.port, get("/api/runs", host))
        assert status == 403 and json.loads(body)["error"] == "PERMISSION_DENIED"
        assert (await exchange(site.port, get("/", host)))[0] == 403
    finally:
        site.close()


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:7421", "127.0.0.1:80", "127.9.9.9",
                                  "[::1]:80", "[::1]", "dash.localhost:80"])
async def test_a_request_addressed_to_a_loopback_name_is_answered(host: str) -> None:
    site = await Site.start()
    try:
        status, body = await exchange(site.port, get("/metrics", host))
        assert status == 200 and body == b"rsd_up 1\n"
    finally:
        site.close()


async def test_with_a_tokens_file_metrics_answers_any_name(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{hash_token(new_token())} ops admin\n")
    site = await Site.start(tokens)
    try:
        assert (await exchange(site.port, get("/metrics", "rsd.example:7421")))[0] == 200
        assert (await exchange(site.port, get("/api/runs", "rsd.example:7421")))[0] == 401
    finally:
        site.close()
