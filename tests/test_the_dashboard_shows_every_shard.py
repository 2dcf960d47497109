"""The dashboard of a sharded cluster shows every shard from any node (rsd/http/
shardviews.py): its overview lists the shards with their primaries, members, slots and
runs, and the figures summed with each shard's beside; the runs, pools and mailboxes of
both shards are listed, each row naming its shard, paged with one cursor that carries
each shard's position; a run's page is read from its run's shard, whichever node serves
the page, and an action on it is done there; the other shard is asked with the
requester's own token, so a tenant's token sees only its tenant there too and a
client-role token gets there only what it gets here. In a real browser (Chromium, as
tests/test_dashboard_in_a_browser.py), the overview lists both shards with their slots
and a run of each shard is listed and its page opens. Each node's /metrics names its
shard and the slots its map gives it, and the source of the move counts it done.

Two real shards of one node each on one etcd (``--fsync no``, a tokens file), the slots
split with ``rsctl slots move`` before any run exists, runs placed on each by their
placement's slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from support.browser import CHROMIUM, FLAGS, keep_problems, load_page
from support.etcd import EtcdCluster
from support.http import http
from support.process import Rsd
from support.shards import shard_args

from rsclient import AsyncRunstate
from rsctl.main import run as rsctl
from rsd.security.tokens import hash_token, new_token
from rsproto.slots import slot_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

WITHIN = 30.0  # seconds for both shards to lead and know each other (a loaded machine)
# The cluster lease: no takeover is tested here, and a primary starved of CPU for 2 s (the
# suite's usual lease) steps down, which the dashboard rightly shows as a shard without a
# primary (seen once beside two busy loops): a long lease keeps each shard's primary.
LEASE = "10"
SLOTS = 1024
SPLIT = 511  # slots 0..SPLIT are s2's, the rest s1's
OPS, ACME, CLIENT = new_token(), new_token(), new_token()  # ops admin, acme admin, ops client


def owner(placement: str) -> str:
    return "s2" if slot_of(placement, SLOTS) <= SPLIT else "s1"


def placements(shard: str, count: int) -> list[str]:
    """``count`` placements whose slots ``shard`` owns once the slots are split."""
    return [p for p in (f"p{n}" for n in range(10_000)) if owner(p) == shard][:count]


@dataclass
class Shards:
    nodes: dict[str, Rsd]  # shard -> its one node
    ports: dict[str, int]  # shard -> its node's HTTP listener
    runs: dict[str, str] = field(default_factory=dict)  # ops' runs -> their shard
    acme_run: str = ""  # acme's one run, on s2


async def _until_both_lead(address: str) -> None:
    """Until ``rsctl slots`` on ``address`` shows two shards, each with its primary."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while True:
        code, shown = await _rsctl_json(address, "slots", "--json")
        if code == 0 and len(shown["shards"]) == 2 and all(s["primary"] for s in shown["shards"]):
            return
        assert loop.time() < deadline, shown
        await asyncio.sleep(0.1)


async def _rsctl_json(address: str, *argv: str) -> tuple[int, Any]:
    """rsctl's exit code and its --json output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = await rsctl(["--address", address, "--token", OPS, *argv])
    try:
        return code, json.loads(out.getvalue())
    except ValueError:
        return code, out.getvalue()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shards(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Shards]:
    root = tmp_path_factory.mktemp("dashboard-shards")
    etcd = EtcdCluster(root / "etcd", 1).start()
    nodes = {name: Rsd(root / name) for name in ("s1", "s2")}
    try:
        for name, node in nodes.items():
            tokens = node.write_tokens(f"{hash_token(OPS)} ops admin",
                                       f"{hash_token(ACME)} acme admin",
                                       f"{hash_token(CLIENT)} ops client")
            cluster_token = node.root / "cluster-token"
            cluster_token.write_text(OPS)
            await node.start(*shard_args(etcd, name, lease=LEASE, cluster="dash", fsync="no"),
                             "--tokens-file", str(tokens),
                             "--cluster-token-file", str(cluster_token),
                             "--http-listen", "127.0.0.1:0")
        first = nodes["s1"].address
        await _until_both_lead(first)
        code, moved = await _rsctl_json(first, "slots", "move", f"0-{SPLIT}", "--to", "s2",
                                        "--json")
        assert code == 0, moved
        made = Shards(nodes, {name: node.metrics_port() for name, node in nodes.items()})
        async with AsyncRunstate(holder="ops-1", address=first, token=OPS) as rs:
            await rs.mailboxes.ensure("jobs")
            for shard in ("s1", "s2"):
                for placement in placements(shard, 2):
                    scope = await rs.scopes.create(placement=placement)
                    made.runs[scope.id] = shard
                    await scope.mailbox("jobs").submit({"on": shard}, key="k")
                tag = placements(shard, 1)[0]
                await rs.pools.ensure(f"{{{tag}}}gpu", size=2)
        async with AsyncRunstate(holder="acme-1", address=first, token=ACME) as rs:
            made.acme_run = (await rs.scopes.create(placement=placements("s2", 1)[0])).id
        yield made
    finally:
        for node in nodes.values():
            if node.proc is not None:
                node.stop_now()
        etcd.stop()


def _samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("rsd_")}


async def _walk(port: int, path: str, field_name: str, token: str, limit: int) -> list[Any]:
    """Every row of a listing, page after page through its cursor."""
    found: list[Any] = []
    cursor: str | int | None = 0
    while cursor is not None:
        status, page = await http(port, "GET", f"{path}?limit={limit}&cursor={cursor}", token)
        assert status == 200, page
        assert len(page[field_name]) <= limit and "unavailable" not in page
        found += page[field_name]
        cursor = page["next"]
    return found


async def test_either_node_shows_both_shards_and_its_metrics_name_its_own(
    shards: Shards,
) -> None:
    for shard, done in (("s1", 1), ("s2", 0)):
        status, text = await http(shards.ports[shard], "GET", "/metrics")
        assert status == 200
        found = _samples(str(text))
        assert found[f'rsd_shard_info{{shard="{shard}"}}'] == 1
        assert (found["rsd_slots"], found["rsd_slots_owned"]) == (SLOTS, SLOTS // 2)
        assert found["rsd_slot_map_epoch"] >= 2  # made, then the split
        assert found['rsd_slot_moves_total{result="done"}'] == done  # s1 moved 0-511 away
        assert found['rsd_slot_moves_total{result="failed"}'] == 0
        assert (found["rsd_slot_move_pause_seconds"] > 0) == bool(done)

    ops_runs = shards.runs
    for serving in ("s1", "s2"):
        port = shards.ports[serving]
        status, overview = await http(port, "GET", "/api/overview", OPS)
        assert status == 200, overview
        assert [(r["shard"], r["primary"], r["slots"], r["runs"]) for r in overview["shards"]] == [
            ("s1", "s1", [[SPLIT + 1, SLOTS - 1]], 2), ("s2", "s2", [[0, SPLIT]], 3)]
        assert [m["node"] for r in overview["shards"] for m in r["members"]] == ["s1", "s2"]
        assert (overview["slots"], overview["shard"]) == (SLOTS, serving)
        stats = overview["stats"]
        assert set(stats["shards"]) == {"s1", "s2"} and stats["core"]["scopes"] == 5
        assert stats["leases_held"] == sum(s["leases_held"] for s in stats["shards"].values())
        assert {r["scope"]: r["shard"] for r in overview["recent_runs"]} == ops_runs
        assert sorted((m["shard"], m["ready"]) for m in overview["mailboxes"]["mailboxes"]) == [
            ("s1", 2), ("s2", 2)]

        for limit in (1, 3, 100):  # every run of the tenant once, naming its shard
            runs = await _walk(port, "/api/runs", "scopes", OPS, limit)
            assert {r["scope"]: r["shard"] for r in runs} == ops_runs and len(runs) == 4
        pools = await _walk(port, "/api/pools", "pools", OPS, 1)
        assert sorted(p["shard"] for p in pools) == ["s1", "s2"]

        for run, shard in ops_runs.items():  # a run's page, from its shard
            status, page = await http(port, "GET", f"/api/runs/{run}", OPS)
            assert status == 200 and page["shard"] == shard, page
            assert [t["key"] for t in page["tasks"]["tasks"]] == ["k"]
            assert page["run"]["tasks"] == {"PENDING": 1}, page["run"]
            status, task = await http(
                port, "GET", f"/api/runs/{run}/tasks/{page['tasks']['tasks'][0]['id']}", OPS)
            assert status == 200 and task["data"] == {"on": shard}, task

    # Another tenant's token sees its own runs only, on every shard.
    acme = await _walk(shards.ports["s1"], "/api/runs", "scopes", ACME, 100)
    assert [(r["scope"], r["shard"]) for r in acme] == [(shards.acme_run, "s2")]
    some_ops_run = next(run for run, shard in ops_runs.items() if shard == "s2")
    status, _ = await http(shards.ports["s1"], "GET", f"/api/runs/{some_ops_run}", ACME)
    assert status == 404
    # A client-role token: the admin ops refused on the other shard too, its own allowed.
    status, refused = await http(shards.ports["s1"], "GET", f"/api/runs/{some_ops_run}", CLIENT)
    assert status == 403 and refused["error"] == "PERMISSION_DENIED", refused
    status, counts = await http(
        shards.ports["s1"], "GET", f"/api/runs/{some_ops_run}/mailboxes/jobs", CLIENT)
    assert status == 200 and counts["counts"]["ready"] == 1, counts

    # An action on a run of the other shard is done there.
    status, cancelled = await http(shards.ports["s1"], "POST",
                                   f"/api/runs/{shards.acme_run}/cancel", ACME,
                                   {"reason": "from s1's dashboard"})
    assert status == 200, cancelled
    status, page = await http(shards.ports["s2"], "GET", f"/api/runs/{shards.acme_run}", ACME)
    assert page["run"]["state"] == "cancelled" and page["shard"] == "s2", page


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no {CHROMIUM} (make test installs it)")
async def test_a_browser_sees_both_shards_and_opens_a_run_of_each(shards: Shards) -> None:
    playwright = pytest.importorskip("playwright.async_api")
    expect = playwright.expect
    base = f"http://127.0.0.1:{shards.ports['s1']}/"
    problems: list[str] = []
    async with playwright.async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS,
                                               headless=True)
        try:
            page = await browser.new_page()
            keep_problems(page, problems)  # (support/browser.py: which are problems)
            await load_page(page, base + "#token=" + OPS)
            main = page.locator("main")
            table = main.locator("#shards")
            for shard, slots in (("s1", f"{SPLIT + 1}-{SLOTS - 1}"), ("s2", f"0-{SPLIT}")):
                row = table.locator("tr").filter(has_text=slots)
                await expect(row.locator("td").nth(0)).to_have_text(shard, timeout=15_000)
                await expect(row.locator("td").nth(3)).to_have_text(slots)
            await page.goto(base + "#/runs")
            listed = main.locator("#runs")
            for run, shard in shards.runs.items():
                await expect(listed.locator("tr").filter(has_text=run).locator("td").nth(0)
                             ).to_have_text(shard, timeout=15_000)
            for shard in ("s1", "s2"):
                run = next(r for r, s in shards.runs.items() if s == shard)
                await page.goto(base + "#/runs")
                await listed.locator("a", has_text=run).click()
                await expect(page.locator("h1")).to_have_text(f"Run {run}", timeout=15_000)
                await expect(main.locator(".card").filter(has_text="shard")).to_contain_text(
                    shard)
                await expect(main).to_contain_text("PENDING")
        finally:
            await browser.close()
    assert problems == []
