"""The dashboard's JSON API over HTTP on a real rsd (``--http-listen``): every route shows
the live state; the actions act (requeue one or all dead letters, checked through the
SDK; cancel ends the run); who asks is the protocol's rule (no token or a wrong one: 401,
a client token: 403, a tenant's admin token sees only its own tenant's runs); every
answer is one page; a non-loopback HTTP listener without a tokens file refuses to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.certs import Certs
from support.http import http
from support.process import Rsd

from rsclient import AsyncRunstate, ScopeCancelledError
from rsd.security.tokens import hash_token, new_token

OPS, ACME, ACME_CLIENT = new_token(), new_token(), new_token()


async def populated(server: Rsd) -> tuple[int, AsyncRunstate, AsyncRunstate, Any, Any]:
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin", f"{hash_token(ACME)} acme admin",
                                 f"{hash_token(ACME_CLIENT)} acme client")
    await server.start("--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0")
    ops = AsyncRunstate("ops-1", server.address, token=OPS)
    acme = AsyncRunstate("acme-1", server.address, token=ACME)
    run = await ops.scopes.create()
    for key in ("a", "b"):
        assert (await run.claim(key).try_acquire())["kind"] == "acquired"
    await ops.mailboxes.ensure("jobs", mode="WORK", max_attempts=1)
    box = run.mailbox("jobs")
    for n in range(4):
        await box.submit({"n": n}, key=f"job-{n}")
    for _ in range(2):
        await (await box.receive()).reject("bad input")
    await box.submit({"n": 99}, key="later", delay_seconds=3600)
    await ops.pools.ensure("gpu", size=2)
    await run.schedules.ensure("nightly", mailbox="jobs", cron="0 3 * * *")
    acme_run = await acme.scopes.create()
    return server.metrics_port(), ops, acme, run, acme_run


async def test_every_route_shows_the_live_state_and_the_actions_act(
    rsds: Callable[..., Rsd],
) -> None:
    port, ops, acme, run, _ = await populated(rsds())
    try:
        status, page = await http(port, "GET", "/", OPS)
        assert status == 200 and "<title>rsd dashboard</title>" in page
        for asset in ("/static/app.js", "/static/app.css"):
            assert (await http(port, "GET", asset))[0] == 200

        status, overview = await http(port, "GET", "/api/overview", OPS)
        assert status == 200 and overview["tenant"] == "ops" and overview["role"] == "admin"
        stats = overview["stats"]
        assert stats["connections"] >= 2 and stats["leases_held"] >= 2
        assert [b["mailbox"] for b in stats["queue_depths"]["mailboxes"]] == ["jobs"]
        assert overview["cluster"] is None

        status, runs = await http(port, "GET", "/api/runs", OPS)
        assert status == 200 and [r["scope"] for r in runs["scopes"]] == [run.id]

        status, one = await http(port, "GET", f"/api/runs/{run.id}", OPS)
        assert status == 200 and one["run"]["state"] == "open"
        assert [(c["key"], c["holder"], c["generation"] > 0, c["expires_in"] > 0)
                for c in one["claims"]["claims"]] == [("a", "ops-1", True, True),
                                                      ("b", "ops-1", True, True)]
        assert sorted(t["key"] for t in one["tasks"]["tasks"]) == [
            "job-0", "job-1", "job-2", "job-3", "later"]
        failed = [t for t in one["tasks"]["tasks"] if t["state"] == "FAILED"]
        assert len(failed) == 2

        status, task = await http(port, "GET", f"/api/runs/{run.id}/tasks/{failed[0]['id']}",
                                  OPS)
        assert status == 200 and task["data"] == {"n": 0} and task["state"] == "FAILED"

        status, box = await http(port, "GET", f"/api/runs/{run.id}/mailboxes/jobs", OPS)
        assert status == 200
        assert box["counts"]["delayed"] == 1 and box["counts"]["dead_letters"] == 2
        status, dead = await http(port, "GET", f"/api/runs/{run.id}/mailboxes/jobs/dead-letters",
                                  OPS)
        assert status == 200 and sorted(d["key"] for d in dead["items"]) == ["job-0", "job-1"]

        status, pools = await http(port, "GET", "/api/pools", OPS)
        assert status == 200 and [p["name"] for p in pools["pools"]] == ["gpu"]
        status, schedules = await http(port, "GET", f"/api/runs/{run.id}/schedules", OPS)
        assert status == 200 and [s["name"] for s in schedules["schedules"]] == ["nightly"]

        # Actions: POSTs only; requeue one, then all (deleting: the next test file).
        base = f"/api/runs/{run.id}/mailboxes/jobs"
        status, _ = await http(port, "GET", base + "/requeue", OPS)
        assert status == 404
        first = dead["items"][0]["id"]
        status, did = await http(port, "POST", base + "/requeue", OPS, {"id": first})
        assert status == 200 and did["left"] == 1
        status, did = await http(port, "POST", base + "/requeue", OPS, {"all": True})
        assert status == 200 and did["left"] == 0 and len(did["requeued"]) == 1
        counts = await run.mailbox("jobs").inspect()  # through the SDK
        assert counts["dead_letters"] == 0 and counts["ready"] == 4
        status, _ = await http(port, "POST", base + "/dead-letters/x/delete", OPS)
        assert status == 404  # no longer on the list

        status, cancelled = await http(port, "POST", f"/api/runs/{run.id}/cancel", OPS)
        assert status == 200 and cancelled["cancelled"] is True
        assert (await run.status())["state"] == "cancelled"
        with pytest.raises(ScopeCancelledError):
            await run.claim("z").try_acquire()
    finally:
        await ops.close()
        await acme.close()


async def test_who_may_look_is_the_protocols_rule(rsds: Callable[..., Rsd]) -> None:
    port, ops, acme, run, acme_run = await populated(rsds())
    try:
        status, refused = await http(port, "GET", "/api/overview")
        assert status == 401 and refused["error"] == "UNAUTHENTICATED"
        assert (await http(port, "GET", "/api/runs", new_token()))[0] == 401
        status, denied = await http(port, "GET", "/api/runs", ACME_CLIENT)
        assert status == 403 and denied["error"] == "PERMISSION_DENIED"
        assert (await http(port, "GET", "/api/overview", ACME_CLIENT))[0] == 403

        # A tenant's admin token: its own runs only; another tenant's do not exist.
        status, runs = await http(port, "GET", "/api/runs", ACME)
        assert status == 200 and [r["scope"] for r in runs["scopes"]] == [acme_run.id]
        assert (await http(port, "GET", f"/api/runs/{run.id}", ACME))[0] == 404
        assert (await http(port, "GET", f"/api/runs/{run.id}/mailboxes/jobs", ACME))[0] == 404
        assert (await http(port, "POST", f"/api/runs/{run.id}/cancel", ACME))[0] == 404
        status, overview = await http(port, "GET", "/api/overview", ACME)
        assert overview["stats"]["queue_depths"]["mailboxes"] == []  # ops's are not named
        assert (await run.status())["state"] == "open"
    finally:
        await ops.close()
        await acme.close()


async def test_a_page_is_at_most_a_thousand_rows(rsds: Callable[..., Rsd]) -> None:
    server = rsds()
    await server.start("--http-listen", "127.0.0.1:0")
    port = server.metrics_port()
    async with AsyncRunstate("many", server.address) as rs:  # no tokens file: loopback
        await asyncio.gather(*(rs.scopes.create() for _ in range(1005)))
        status, _ = await http(port, "GET", "/api/runs?limit=1001")
        assert status == 400
        status, first = await http(port, "GET", "/api/runs?limit=1000")
        assert status == 200 and len(first["scopes"]) <= 1000 and first["next"] is not None
        seen = [r["scope"] for r in first["scopes"]]
        cursor = first["next"]
        while cursor is not None:
            status, more = await http(port, "GET", f"/api/runs?limit=1000&cursor={cursor}")
            seen += [r["scope"] for r in more["scopes"]]
            cursor = more["next"]
        assert len(seen) == len(set(seen)) == 1005


async def test_a_non_loopback_http_listener_needs_a_tokens_file(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    assert await server.refused("--http-listen", "0.0.0.0:0") == 2
    assert "without a tokens file" in server.log()
    assert await server.refused("--http-listen", "0.0.0.0:0", "--insecure") == 2


async def test_the_http_listener_speaks_tls_like_the_protocol_port_and_the_old_key_works(
    rsds: Callable[..., Rsd], tmp_path: Any,
) -> None:
    certs = Certs(tmp_path / "certs")
    server = rsds()
    config = tmp_path / "rsd.toml"
    config.write_text('metrics_listen = "127.0.0.1:0"\n')  # the old key: an alias
    await server.start("--config", str(config), *certs.server_flags())
    port = server.metrics_port()
    assert f"dashboard at https://127.0.0.1:{port}/" in server.log()
    status, overview = await http(port, "GET", "/api/overview", tls=certs.client_context())
    assert status == 200 and overview["stats"]["tls"] is True
    with pytest.raises((ConnectionError, IndexError)):  # closed, no HTTP answer
        await http(port, "GET", "/api/overview")  # plain HTTP on the TLS port: nothing


async def raw(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_another_site_cannot_act_through_a_browser(rsds: Callable[..., Rsd]) -> None:
    """No tokens file (loopback, no credential at all): a page of another site can
    neither read the API by rebinding its name to 127.0.0.1 (the Host header says its
    name) nor act by a form POST (not JSON) or a request from its origin."""
    server = rsds()
    await server.start("--http-listen", "127.0.0.1:0")
    port = server.metrics_port()
    async with AsyncRunstate("ops", server.address) as rs:
        run = await rs.scopes.create()
        assert await raw(port, b"GET /api/runs HTTP/1.1\r\nHost: evil.example:80\r\n\r\n") == 403
        assert await raw(port, f"GET /api/runs HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"
                         .encode()) == 200
        cancel = f"POST /api/runs/{run.id}/cancel HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        form = "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"
        assert await raw(port, (cancel + form).encode()) == 415
        foreign = ("Origin: http://evil.example\r\nContent-Type: application/json\r\n"
                   "Content-Length: 2\r\n\r\n{}")
        assert await raw(port, (cancel + foreign).encode()) == 403
        assert (await run.status())["state"] == "open"
        own = (f"Origin: http://127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               "Content-Length: 2\r\n\r\n{}")
        assert await raw(port, (cancel + own).encode()) == 200
        assert (await run.status())["state"] == "cancelled"
