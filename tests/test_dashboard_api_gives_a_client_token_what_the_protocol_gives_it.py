"""A client-role token may do through the dashboard's API exactly what its HELLO may do
over the protocol (one rule: the core's handlers and session.server_stats decide, on an
internal connection with the token's tenant and role), and the manual (docs/http.md) says
which routes that is. Every route of its route table is tried with a client-role token on
a real rsd: the routes of its client table answer it, every other one is 403
PERMISSION_DENIED and changes nothing. Before: the README said a client token gets 403,
while it could cancel its runs and read pools, schedules and mailbox counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from support.dashboard import populate
from support.http import http
from support.manual import page
from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.security.tokens import hash_token, new_token

ROUTE = re.compile(r"^\| `(GET|POST) (/api/[^`?]*)")
CLIENT_TABLE = "| route a client-role token may use |"


def readme_routes() -> tuple[list[tuple[str, str]], set[tuple[str, str]]]:
    """The manual's API routes (method, path without its query), and those its client
    table lets a client-role token use."""
    section = page("http.md")
    routes: list[tuple[str, str]] = []
    allowed: set[tuple[str, str]] = set()
    in_client_table = False
    for line in section.splitlines():
        if line.startswith(CLIENT_TABLE):
            in_client_table = True
        elif not line.startswith("|"):
            in_client_table = False
        found = ROUTE.match(line)
        if found is not None:
            (allowed.add if in_client_table else routes.append)((found[1], found[2]))
    return routes, allowed


def test_the_manual_names_every_route_a_client_may_use_among_the_routes() -> None:
    routes, allowed = readme_routes()
    assert len(routes) >= 17 and allowed, "the manual's route table and client table"
    assert allowed <= set(routes)


async def test_every_route_answers_a_client_token_as_the_protocol_would(
    rsds: Callable[..., Rsd],
) -> None:
    routes, allowed = readme_routes()
    admin, client = new_token(), new_token()
    server = rsds()
    tokens = server.write_tokens(f"{hash_token(admin)} acme admin",
                                 f"{hash_token(client)} acme client")
    await server.start("--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0")
    port = server.metrics_port()
    async with AsyncRunstate("acme-1", server.address, token=admin) as rs:
        made = await populate(rs, runs=1)
        run = made.run.id
        status, dead = await http(port, "GET", f"/api/runs/{run}/mailboxes/jobs/dead-letters",
                                  admin)
        assert status == 200 and len(dead["items"]) == 2

        def concrete(path: str) -> str:
            """``path`` with its placeholders (RUN, NAME, TASK, ID) made real."""
            values = {"RUN": run, "TASK": made.succeeded, "ID": dead["items"][0]["id"]}
            parts = path.split("/")
            for n, part in enumerate(parts):
                if part == "NAME":
                    parts[n] = {"mailboxes": "jobs", "pools": "gpu"}[parts[n - 1]]
                elif part.isupper():
                    parts[n] = values[part]
            return "/".join(parts)

        bodies: dict[str, Any] = {"requeue": {"all": True}}
        answered: dict[tuple[str, str], int] = {}
        for method, path in sorted(routes, key=lambda route: route[1].endswith("/cancel")):
            body = bodies.get(path.rsplit("/", 1)[-1], {}) if method == "POST" else None
            if method == "GET":  # the route itself is good: an admin token gets its answer
                assert (await http(port, method, concrete(path), admin))[0] == 200, path
            status, answer = await http(port, method, concrete(path), client, body)
            answered[(method, path)] = status
            if (method, path) not in allowed:
                assert answer["error"] == "PERMISSION_DENIED", (method, path, answer)
        assert answered == {route: 200 if route in allowed else 403 for route in routes}

        # what was refused changed nothing; the cancel the protocol allows a client did
        status, dead_after = await http(
            port, "GET", f"/api/runs/{run}/mailboxes/jobs/dead-letters", admin)
        assert dead_after["items"] == dead["items"]
        assert (await made.run.status())["state"] == "cancelled"
