"""The dashboard API's routes for the overview's chart, the newest runs, every mailbox,
a run's groups and mailboxes, quotas, a pool's holders and deleting a dead letter, on a
real rsd: each shows the live state; each answer is one page (at most 1,000 rows and
1 MiB: a listing is paged with a cursor, a schedule's big data is cut to a preview);
bad input is refused (a cursor the API never gave, a limit out of range, an unknown run
is 404); another tenant's objects do not exist for a tenant's token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support.dashboard import populate
from support.http import http
from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.http.api import MAX_ANSWER_BYTES
from rsd.http.history import COLUMNS
from rsd.security.tokens import hash_token, new_token

OPS, ACME, ACME_CLIENT = new_token(), new_token(), new_token()


async def started(server: Rsd) -> int:
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin", f"{hash_token(ACME)} acme admin",
                                 f"{hash_token(ACME_CLIENT)} acme client")
    await server.start("--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0")
    return server.metrics_port()


async def test_the_new_routes_show_the_live_state_and_delete_deletes(
    rsds: Callable[..., Rsd], eventually: Callable[..., Any],
) -> None:
    server = rsds()
    port = await started(server)
    async with AsyncRunstate("ops-1", server.address, token=OPS) as ops:
        made = await populate(ops)
        run = made.run.id

        status, overview = await http(port, "GET", "/api/overview", OPS)
        assert status == 200
        assert [r["scope"] for r in overview["recent_runs"]] == [run, *reversed(made.others)]
        boxes = {m["name"]: m for m in overview["mailboxes"]["mailboxes"]}
        assert (boxes["jobs"]["ready"], boxes["jobs"]["running"]) == (3, 1)
        assert boxes["emails"]["ready"] == 2 and overview["mailboxes"]["next"] is None

        async def sampled() -> bool:  # one row a second, from the start
            return len((await http(port, "GET", "/api/history", OPS))[1]["rows"]) >= 2
        await eventually(sampled, timeout=15.0)
        status, history = await http(port, "GET", "/api/history", OPS)
        assert status == 200 and history["columns"] == list(COLUMNS)
        newest = dict(zip(COLUMNS, history["rows"][-1], strict=True))
        assert newest["connections"] >= 1 and newest["leases_held"] >= 6  # claims, slot, ...
        assert newest["pending"] >= 5 and newest["running"] == 1 and newest["delayed"] == 1
        status, after = await http(port, "GET", f"/api/history?after={history['last']}", OPS)
        assert status == 200 and all(row[0] > history["rows"][-1][0] for row in after["rows"])

        status, mailboxes = await http(port, "GET", "/api/mailboxes?limit=1", OPS)
        assert status == 200 and [m["name"] for m in mailboxes["mailboxes"]] == ["jobs"]
        status, rest = await http(port, "GET", f"/api/mailboxes?cursor={mailboxes['next']}", OPS)
        assert [m["name"] for m in rest["mailboxes"]] == ["emails"] and rest["next"] is None
        status, newest_first = await http(port, "GET", "/api/runs?newest_first=1&limit=2", OPS)
        assert [r["scope"] for r in newest_first["scopes"]] == [run, made.others[-1]]

        status, groups = await http(port, "GET", f"/api/runs/{run}/groups", OPS)
        assert status == 200 and groups["next"] is None
        assert [(g["group"], g["tasks"], g["counts"]) for g in groups["groups"]] == [
            ("batch-1", 3, {"PENDING": 3})]
        status, queues = await http(port, "GET", f"/api/runs/{run}/mailboxes", OPS)
        assert status == 200 and [q["mailbox"] for q in queues["mailboxes"]] == ["jobs", "emails"]
        assert queues["mailboxes"][0] == {"mailbox": "jobs", "ready": 3, "running": 1,
                                          "delayed": 1, "waiting": 0, "consumers": 0,
                                          "dead_letters": 2,
                                          "paused": False, "blocked_by_parents": 0}

        status, quotas = await http(port, "GET", "/api/quotas", OPS)
        assert status == 200 and [(q["name"], q["limit"], q["waiters"]) for q in
                                  quotas["quotas"]] == [("api-calls", 100, 0)]
        assert 70 <= quotas["quotas"][0]["level"] <= 100
        status, gpu = await http(port, "GET", "/api/pools/gpu", OPS)
        assert status == 200 and (gpu["size"], gpu["held"]) == (4, 1)
        assert [(h["holder"], h["run"]) for h in gpu["holders"]] == [("ops-1", run)]

        box = f"/api/runs/{run}/mailboxes/jobs"
        status, deleted = await http(port, "POST", f"{box}/dead-letters/{made.dead[0]}/delete", OPS)
        assert status == 200 and deleted == {"deleted": made.dead[0], "left": 1}
        status, listed = await http(port, "GET", f"{box}/dead-letters", OPS)
        assert [d["id"] for d in listed["items"]] == [made.dead[1]]
        counts = await made.run.mailbox("jobs").inspect()  # through the SDK
        assert counts["dead_letters"] == 1 and counts["ready"] == 3  # not requeued
        status, again = await http(port, "POST", f"{box}/dead-letters/{made.dead[0]}/delete", OPS)
        assert status == 404 and again["error"] == "NOT_FOUND"
        status, _ = await http(port, "GET", f"{box}/dead-letters/{made.dead[1]}/delete", OPS)
        assert status == 404  # an action is a POST


async def test_bad_input_is_refused_and_another_tenants_objects_do_not_exist(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    port = await started(server)
    async with (
        AsyncRunstate("ops-1", server.address, token=OPS) as ops,
        AsyncRunstate("acme-1", server.address, token=ACME) as acme,
    ):
        made = await populate(ops, runs=0)
        run = made.run.id
        acme_run = await acme.scopes.create()
        listings = ["/api/runs", "/api/mailboxes", "/api/quotas", "/api/pools",
                    f"/api/runs/{run}/groups", f"/api/runs/{run}/mailboxes"]
        for route in listings:
            assert (await http(port, "GET", route + "?limit=1000", OPS))[0] == 200, route
            for query in ("limit=0", "limit=1001", "limit=x", "cursor=abc", "cursor=-1",
                          "cursor=" + "9" * 20, "newest_first=maybe"):
                status, refused = await http(port, "GET", f"{route}?{query}", OPS)
                assert (status, refused["error"]) == (400, "INVALID_ARGUMENT"), (route, query)
        assert (await http(port, "GET", "/api/history?after=x", OPS))[0] == 400
        assert (await http(port, "GET", "/api/pools/gpu?limit=1001", OPS))[0] == 400
        for route in ("/api/runs/nope/groups", "/api/runs/nope/mailboxes", "/api/pools/nope",
                      "/api/runs/nope"):
            status, missing = await http(port, "GET", route, OPS)
            assert (status, missing["error"]) == (404, "NOT_FOUND"), route
        delete = f"/api/runs/{run}/mailboxes/jobs/dead-letters/{made.dead[0]}/delete"
        assert (await http(port, "POST", delete.replace(made.dead[0], "t-999"), OPS))[0] == 404

        # acme's admin token: ops's run, its groups, mailboxes, dead letters, pools and
        # quotas are not there; acme's own are.
        for route in (f"/api/runs/{run}/groups", f"/api/runs/{run}/mailboxes",
                      "/api/pools/gpu"):
            assert (await http(port, "GET", route, ACME))[0] == 404, route
        assert (await http(port, "POST", delete, ACME))[0] == 404
        assert (await made.run.mailbox("jobs").inspect())["dead_letters"] == 2
        for route, field in (("/api/mailboxes", "mailboxes"), ("/api/quotas", "quotas"),
                             ("/api/pools", "pools")):
            status, theirs = await http(port, "GET", route, ACME)
            assert status == 200 and theirs[field] == [], route
        status, overview = await http(port, "GET", "/api/overview", ACME)
        assert [r["scope"] for r in overview["recent_runs"]] == [acme_run.id]
        assert overview["mailboxes"]["mailboxes"] == []
        # A client token reads none of it, the chart neither.
        for route in ("/api/history", "/api/quotas", f"/api/runs/{acme_run.id}/groups"):
            assert (await http(port, "GET", route, ACME_CLIENT))[0] == 403, route


async def test_every_answer_is_one_page_of_at_most_a_thousand_rows_and_one_mib(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds()
    await server.start("--http-listen", "127.0.0.1:0")  # no tokens file: loopback, admin
    port = server.metrics_port()
    async with AsyncRunstate("many", server.address) as rs:
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("jobs", mode="WORK")
        box = run.mailbox("jobs")
        for n in range(1100):  # a group each: more than one page
            await box.submit(n, key=f"k{n}", group=f"g{n}", slim=True)
        seen: list[str] = []
        cursor: int | None = 0
        while cursor is not None:
            status, page = await http(port, "GET",
                                      f"/api/runs/{run.id}/groups?limit=1000&cursor={cursor}")
            assert status == 200 and len(page["groups"]) <= 1000
            seen += [g["group"] for g in page["groups"]]
            cursor = page["next"]
        assert len(seen) == len(set(seen)) == 1100
        # A run's schedules carry their data: the core's pages are bounded in its bytes
        # (a few schedules of big data to a page, with a cursor), and big data is cut to
        # a preview, so each answer stays within 1 MiB however many there are.
        big = "x" * 200_000
        for n in range(6):
            await run.schedules.ensure(f"s{n}", mailbox="jobs", every_seconds=3600,
                                       data={"blob": big})
        reader, writer = await _raw_get(port, f"/api/runs/{run.id}/schedules")
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ") and len(answer) < MAX_ANSWER_BYTES
        listed = []
        cursor = 0
        while cursor is not None:
            status, page = await http(port, "GET", f"/api/runs/{run.id}/schedules?cursor={cursor}")
            assert status == 200 and 1 <= len(page["schedules"]) < 6
            listed += page["schedules"]
            cursor = page["next"]
        assert [s["name"] for s in listed] == [f"s{n}" for n in range(6)]
        assert all(s["data"]["cut"] and len(s["data"]["preview"]) <= 4096 for s in listed)
        status, history = await http(port, "GET", "/api/history")
        assert status == 200 and len(history["rows"]) <= 1000


async def _raw_get(port: int, path: str) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return reader, writer
