"""The dashboard's API of a sharded cluster answers with what it has (rsd/http/
shardviews.py): a shard whose primary does not answer (a hung process: it accepts and
never replies) or that has no primary is shown as such, each within the request's
time-out, while the shards that answer are listed and merged; a run of such a shard is
503 UNAVAILABLE; and the wait for a hung shard blocks no other request of the listener.

Two servers in one loop (shards a and b, each its own core, the real wire between them)
and two shards that cannot be asked: c (a hung primary) and d (none). The time-out is
shortened to 1 s (the second test ends c's wait itself); no assertion is on wall-clock
time, only on what is answered and in which order."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.http import http

from rsd.core import Core
from rsd.http import shardviews
from rsd.http.api import Api
from rsd.http.dashboard import Dashboard
from rsd.http.httpserver import HttpEndpoint
from rsd.http.metricshttp import MetricsPage
from rsd.http.shardviews import Sharded
from rsd.metrics import render
from rsd.security.auth import Authenticator
from rsd.server import Server
from rsd.slotowner import SlotOwner
from rsproto import Op
from rsproto.slots import SlotMap, slot_of
from tests.support.raw import raw_connect

SLOTS = 64
RANGES = ((0, 15, "a"), (16, 31, "b"), (32, 47, "c"), (48, 63, "d"))


def run_in(shard: str, n: int) -> str:
    """The ``n``-th run id whose slot ``shard`` owns."""
    lo, hi, _ = next(entry for entry in RANGES if entry[2] == shard)
    found = (key for key in (f"run-{k}" for k in itertools.count())
             if lo <= slot_of(key, SLOTS) <= hi)
    return next(itertools.islice(found, n, None))


@dataclass
class Cluster:
    port: int  # shard a's HTTP listener
    hung: list[asyncio.StreamWriter]  # the connections c's "primary" took and never answered


async def _served(slot_map: SlotMap, shard: str) -> tuple[Server, str]:
    server = Server(Core(lambda: "unused"), asyncio.get_running_loop(), cluster="c",
                    slots=SlotOwner(slot_map, shard), auth=Authenticator(None))
    host, port = await server.start("127.0.0.1", 0)
    return server, f"{host}:{port}"


@pytest.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    # c's time-out: b, in this very process, answers within it however loaded the machine
    monkeypatch.setattr(shardviews, "PEER_SECONDS", 1.0)
    loop = asyncio.get_running_loop()
    hung: list[asyncio.StreamWriter] = []

    async def never_answers(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)

    silent = await asyncio.start_server(never_answers, "127.0.0.1", 0)
    c_address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    first = SlotMap(SLOTS, 3, RANGES, {})
    a, a_address = await _served(first, "a")
    b, b_address = await _served(first, "b")
    known = SlotMap(SLOTS, 3, RANGES, {"a": a_address, "b": b_address, "c": c_address,
                                       "d": None})
    a.slots.adopt(known)
    b.slots.adopt(known)
    api = Api(loop, Authenticator(None), lambda: a, fanout=Sharded)
    endpoint = HttpEndpoint(loop, Dashboard(MetricsPage(loop, lambda: render(a)), api).handle)
    _, port = await endpoint.bind("127.0.0.1", 0)
    await endpoint.start()
    for address, shard in ((a_address, "a"), (b_address, "b")):
        conn = await raw_connect(address)
        await conn.hello("maker")
        await conn.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
        for n in range(2):
            run = run_in(shard, n)
            await conn.ok(Op.SCOPE_CREATE, {"scope": run})
            await conn.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "key": "k",
                                           "data": shard})
        conn.close()
    try:
        yield Cluster(port, hung)
    finally:
        endpoint.close()
        silent.close()
        for writer in hung:
            writer.close()
        await a.stop()
        await b.stop()


async def test_the_shards_that_answer_are_shown_and_the_others_named(cluster: Cluster) -> None:
    status, page = await http(cluster.port, "GET", "/api/runs?limit=100")
    assert status == 200, page
    assert sorted((row["shard"], row["scope"]) for row in page["scopes"]) == sorted(
        (shard, run_in(shard, n)) for shard in "ab" for n in range(2))
    assert set(page["unavailable"]) == {"c", "d"}
    assert "no primary" in page["unavailable"]["d"]
    assert page["next"] is not None  # c and d are asked again on the next page
    assert len(cluster.hung) == 1  # c's "primary" was asked (and never answered)

    status, overview = await http(cluster.port, "GET", "/api/overview")
    assert status == 200, overview
    rows = {row["shard"]: row for row in overview["shards"]}
    assert [row["shard"] for row in overview["shards"]] == ["a", "b", "c", "d"]
    assert (rows["a"]["runs"], rows["b"]["runs"]) == (2, 2)
    assert rows["a"]["slots"] == [[0, 15]] and rows["d"]["slots"] == [[48, 63]]
    for shard in "cd":
        assert rows[shard]["primary"] is None and rows[shard]["runs"] is None
        assert rows[shard]["error"]
    assert "error" not in rows["a"] and "error" not in rows["b"]
    assert overview["stats"]["core"]["scopes"] == 4  # a's and b's, summed
    assert set(overview["stats"]["shards"]) == {"a", "b"}
    assert sorted(run["shard"] for run in overview["recent_runs"]) == ["a", "a", "b", "b"]
    assert sorted(box["shard"] for box in overview["mailboxes"]["mailboxes"]) == ["a", "b"]

    status, answer = await http(cluster.port, "GET", f"/api/runs/{run_in('c', 0)}")
    assert status == 503 and answer["error"] == "UNAVAILABLE", answer
    status, answer = await http(cluster.port, "GET", f"/api/runs/{run_in('b', 1)}")
    assert status == 200 and answer["shard"] == "b", answer
    assert [task["key"] for task in answer["tasks"]["tasks"]] == ["k"]


async def test_a_hung_shard_holds_up_no_other_request(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # c is waited for up to the listener's deadline now, and the test ends the wait itself
    # (c's connection closed) once the other requests were answered: no race with a timer
    monkeypatch.setattr(shardviews, "PEER_SECONDS", 60.0)
    overview = asyncio.ensure_future(http(cluster.port, "GET", "/api/overview"))
    while not cluster.hung:  # the overview waits for c's answer now
        await asyncio.sleep(0.01)
        assert not overview.done()
    answers: list[Any] = []
    for path in (f"/api/runs/{run_in('a', 0)}", f"/api/runs/{run_in('b', 0)}", "/metrics"):
        answers.append(await http(cluster.port, "GET", path))
    assert [status for status, _ in answers] == [200, 200, 200]
    assert not overview.done()  # all three were answered while c kept it waiting
    for writer in cluster.hung:
        writer.close()
    status, found = await overview
    assert status == 200 and [row.get("error") is not None for row in found["shards"]] == [
        False, False, True, True]
    assert "closed the connection" in found["shards"][2]["error"]
