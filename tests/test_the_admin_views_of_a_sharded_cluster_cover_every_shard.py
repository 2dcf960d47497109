"""The admin views of a sharded cluster cover every shard (rsclient/admin.py and
rsproto/fanout.py, rsctl's listings): a listing that names no run (runs, pools, quotas,
mailboxes) is asked of every shard that owns slots and merged, and paging through its
cursor, which carries each shard's position, returns every object exactly once, each
naming its shard, no page holding more than its ``limit``; a listing or a read that
names a run goes to the run's shard; ``stats()`` gives each shard's SERVER_STATS and
their core counters summed; rsctl's listings, ``stats`` and ``top`` show every shard's
(``--json``: a ``shard`` key per row), ``cluster`` still its primary's view. A server
alone, or a cluster of one shard, is asked as it always was: one request, its objects
and integer cursor as the server gives them.

Two real shards of one node each on one etcd (``--fsync no``), the slots split with
``rsctl slots move`` before any run exists, runs placed on each by their placement's
slot; the lone server and the one-shard node are fake nodes (support/fake.py), which
count the requests they get.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.fake import FakeNode
from support.process import Rsd
from support.shards import shard_args

from rsclient import AsyncRunstate, InvalidArgumentError
from rsctl.main import run
from rsproto import Op
from rsproto.slots import slot_of

WITHIN = 30.0  # seconds for both shards to lead, generously (a loaded machine)
SLOTS = 1024
SPLIT = 511  # slots 0..SPLIT are s2's, the rest s1's
RUNS = 3  # runs on each shard


def placements(shard: str, count: int) -> list[str]:
    """``count`` placements whose slots ``shard`` owns once the slots are split."""
    def owner(p: str) -> str:
        return "s2" if slot_of(p, SLOTS) <= SPLIT else "s1"
    return [p for p in (f"p{n}" for n in range(10_000)) if owner(p) == shard][:count]


async def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """rsctl's output (exit 0 asserted)."""
    capsys.readouterr()
    status = await run(list(argv))
    out, err = capsys.readouterr()
    assert status == 0, (argv, out, err)
    return out


async def led(capsys: pytest.CaptureFixture[str], address: str, shards: int) -> None:
    """Until rsctl slots shows ``shards`` shards, each with its primary."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while True:
        capsys.readouterr()
        if await run(["--address", address, "slots", "--json"]) == 0:
            shown = json.loads(capsys.readouterr().out)
            if len(shown["shards"]) == shards and all(s["primary"] for s in shown["shards"]):
                return
        assert loop.time() < deadline, capsys.readouterr()
        await asyncio.sleep(0.1)


async def pages(rs: AsyncRunstate, op: int, field: str, limit: int) -> list[dict[str, Any]]:
    """Every object of a listing, page by page, each page checked to hold at most
    ``limit`` and to give a merged (string) cursor."""
    found: list[dict[str, Any]] = []
    cursor: int | str | None = 0
    while cursor is not None:
        page, cursor = await rs.admin.page(op, field, cursor=cursor, limit=limit)
        assert len(page) <= limit and (cursor is None or isinstance(cursor, str))
        found += page
    return found


async def test_the_admin_views_of_two_shards_cover_both(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
    capsys: pytest.CaptureFixture[str],
) -> None:
    etcd = etcd_cluster(size=1)
    nodes = [Rsd(tmp_path / f"s{n}") for n in (1, 2)]


    try:
        await nodes[0].start(*shard_args(etcd, "s1", cluster="views", fsync="no"))
        at = ["--address", nodes[0].address]
        await led(capsys, nodes[0].address, 1)
        await nodes[1].start(*shard_args(etcd, "s2", cluster="views", fsync="no"))
        await led(capsys, nodes[0].address, 2)
        await ctl(capsys, *at, "slots", "move", f"0-{SPLIT}", "--to", "s2")

        async with AsyncRunstate(holder="views", address=nodes[0].address) as rs:
            await rs.mailboxes.ensure("m")  # every shard's
            where: dict[str, str] = {}  # run -> its shard
            tasks: dict[str, str] = {}  # run -> its task
            for shard in ("s1", "s2"):
                for placement in placements(shard, RUNS):
                    scope = await rs.scopes.create(placement=placement)
                    where[scope.id] = shard
                    tasks[scope.id] = (await scope.mailbox("m").submit(shard, key="k")).id
                    await scope.claim("c").try_acquire()
                tag = placements(shard, 1)[0]
                await rs.pools.ensure(f"{{{tag}}}gpu", size=2)
                await rs.quotas.ensure(f"{{{tag}}}calls", limit=5, per_seconds=1)

            # Every run of both shards, once, each naming its shard, at any page size.
            for limit in (1, 2, 5, 100):
                runs = await pages(rs, Op.ADMIN_SCOPES, "scopes", limit)
                assert sorted(r["scope"] for r in runs) == sorted(where), limit
                assert all(r["shard"] == where[r["scope"]] for r in runs)
            pools = await pages(rs, Op.ADMIN_POOLS, "pools", 1)
            assert sorted((p["shard"], p["size"]) for p in pools) == [("s1", 2), ("s2", 2)]
            quotas = [q async for q in rs.admin.iter_quotas(limit=1)]
            assert sorted(q["shard"] for q in quotas) == ["s1", "s2"]
            boxes = [m async for m in rs.admin.iter_mailboxes()]
            assert sorted((m["shard"], m["name"], m["ready"]) for m in boxes) == [
                ("s1", "m", RUNS), ("s2", "m", RUNS)]

            # What names a run goes to its shard.
            for scope, shard in where.items():
                listed = [t async for t in rs.admin.iter_tasks(scope)]
                assert [(t["id"], t["shard"]) for t in listed] == [(tasks[scope], shard)]
                assert [c["key"] async for c in rs.admin.iter_claims(scope)] == ["c"]
                assert (await rs.admin.task(scope, tasks[scope]))["data"] == shard
                assert [q["mailbox"] async for q in rs.admin.iter_queues(scope)] == ["m"]

            stats = await rs.admin.stats()
            assert set(stats["shards"]) == {"s1", "s2"}
            each = [s["core"]["scopes"] for s in stats["shards"].values()]
            assert each == [RUNS, RUNS] and stats["core"]["scopes"] == 2 * RUNS
            assert stats["leases_held"] == sum(
                s["leases_held"] for s in stats["shards"].values()) >= 2 * RUNS

            with pytest.raises(InvalidArgumentError, match="cursor"):
                await rs.admin.page(Op.ADMIN_SCOPES, "scopes", cursor="not-a-cursor")

        shown = json.loads(await ctl(capsys, *at, "scopes", "--json"))["scopes"]
        assert {r["scope"]: r["shard"] for r in shown} == where
        s2_run = next(scope for scope, shard in where.items() if shard == "s2")
        listed = json.loads(await ctl(capsys, *at, "tasks", s2_run, "--json"))["tasks"]
        assert [(t["id"], t["shard"]) for t in listed] == [(tasks[s2_run], "s2")]
        table = await ctl(capsys, *at, "mailboxes")
        assert table.splitlines()[0].split()[:2] == ["SHARD", "NAME"]
        assert len(table.splitlines()) == 3
        summed = json.loads(await ctl(capsys, *at, "stats", "--json", "--interval", "0.01"))
        assert summed["core"]["scopes"] == 2 * RUNS
        live = json.loads(await ctl(capsys, *at, "top", "--iterations", "1", "--json"))
        assert live["stats"]["core"]["scopes"] == 2 * RUNS
        assert sorted(r["shard"] for r in live["scopes"]) == ["s1"] * RUNS + ["s2"] * RUNS
        view = json.loads(await ctl(capsys, *at, "cluster", "--json"))
        assert view["primary"] == "s1" and [s["runs"] for s in view["shards"]] == [RUNS, RUNS]
    finally:
        await kill_all(nodes)


@pytest.mark.parametrize("shard", [None, {"name": "only", "slots": SLOTS, "map_epoch": 1}],
                         ids=["alone", "one-shard"])
async def test_a_server_alone_or_one_shard_is_asked_once(shard: dict[str, Any] | None) -> None:
    node = FakeNode("lone")
    node.shard = shard
    node.handlers[Op.ADMIN_SCOPES] = lambda args: {"scopes": [{"scope": "r"}], "next": 7}
    node.handlers[Op.SERVER_STATS] = lambda args: {"core": {"scopes": 1}}
    await node.start()
    try:
        async with AsyncRunstate(holder="views", address=node.address) as rs:
            assert await rs.admin.page(Op.ADMIN_SCOPES, "scopes", limit=5) == (
                [{"scope": "r"}], 7)
            assert await rs.admin.stats() == {"core": {"scopes": 1}}
        assert node.requests == [(Op.ADMIN_SCOPES, {"cursor": 0, "limit": 5}),
                                 (Op.SERVER_STATS, {})]
    finally:
        await node.close()
