"""rsctl against two real shards of one node each over etcd: ``rsctl slots`` lists each
shard's primary, ranges and count; ``slots move LO-HI --to SHARD`` exits 0 once the map
gives the range to SHARD and prints the new owner, refuses an unknown shard (exit 1) and
a malformed range (exit 2), and a range holding a run that holds a pool slot is
refused by its shard (exit 1, saying why); ``slots balance`` spreads the slots evenly,
printing each move; ``cluster --json`` keeps today's keys and adds ``slots``,
``map_epoch`` and ``shards`` with each shard's runs (rsctl/slots.py against
rsd/clustermode.py and the server's SLOTS_MOVE)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.process import Rsd
from support.shards import shard_args

from rsclient import AsyncRunstate
from rsctl.main import run
from rsproto.slots import slot_of

WITHIN = 30.0  # seconds for both shards to lead, generously (a loaded machine)


class Ctl:
    """rsctl in the test's event loop, its output captured."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address, self.capsys = address, capsys

    async def __call__(self, *argv: str, status: int = 0) -> str:
        self.capsys.readouterr()
        got = await run(["--address", self.address, *argv])
        out, err = self.capsys.readouterr()
        assert got == status, (argv, out, err)
        return out or err

    async def json(self, *argv: str) -> Any:
        return json.loads(await self(*argv, "--json"))


async def _led(ctl: Ctl, shards: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while True:
        ctl.capsys.readouterr()
        if await run(["--address", ctl.address, "slots", "--json"]) == 0:
            shown = json.loads(ctl.capsys.readouterr().out)
            if len(shown["shards"]) == shards and all(s["primary"] for s in shown["shards"]):
                return dict(shown)
        assert loop.time() < deadline, ctl.capsys.readouterr()
        await asyncio.sleep(0.1)


async def test_rsctl_lists_moves_and_balances_the_slots_of_two_shards(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
    capsys: pytest.CaptureFixture[str],
) -> None:
    etcd = etcd_cluster(size=1)
    nodes = [Rsd(tmp_path / f"s{n}") for n in (1, 2)]


    try:
        await nodes[0].start(*shard_args(etcd, "s1", cluster="rsctl", fsync="no"))
        ctl = Ctl(nodes[0].address, capsys)
        await _led(ctl, 1)  # s1 made the map: every slot is its own
        await nodes[1].start(*shard_args(etcd, "s2", cluster="rsctl", fsync="no"))
        shown = await _led(ctl, 2)
        assert [(s["shard"], s["count"], s["ranges"]) for s in shown["shards"]] == [
            ("s1", 1024, [[0, 1023]]), ("s2", 0, [])]
        assert shown["map_epoch"] == 1

        moved = await ctl.json("slots", "move", "0-99", "--to", "s2")
        assert (moved["shard"], moved["map_epoch"]) == ("s2", 2)
        assert "owned by s1" in await ctl("slots", "move", "0-9", "--to", "s1")
        assert "not registered" in await ctl("slots", "move", "0-9", "--to", "s9", status=1)
        assert "LO-HI" in await ctl("slots", "move", "9-0", "--to", "s1", status=2)

        # A run in a slot s1 keeps when balancing (it gives away the end of its range).
        keeps = next(f"p{n}" for n in range(100_000) if 100 <= slot_of(f"p{n}", 1024) <= 500)
        async with AsyncRunstate(holder="t", address=nodes[0].address) as rs:
            run = await rs.scopes.create(placement=keeps)
            await rs.pools.ensure(f"{{{keeps}}}gpu", size=1)
            held = await run.pool(f"{{{keeps}}}gpu").acquire()  # a pool slot stays home
            slot = slot_of(run.id, 1024)
            refused = await ctl("slots", "move", f"{slot}-{slot}", "--to", "s2", status=1)
            assert "holds pool slots" in refused
            await held.release()

        said = await ctl("slots", "balance", "--rate", "50")
        assert "->" in said and "balanced: s1 512, s2 512" in said
        assert [s["count"] for s in (await ctl.json("slots"))["shards"]] == [512, 512]

        view = await ctl.json("cluster")
        assert {"cluster", "epoch", "primary", "members"} <= set(view)
        assert view["slots"] == 1024 and view["map_epoch"] >= 3
        by_shard = {s["shard"]: s for s in view["shards"]}
        assert (by_shard["s1"]["primary"], by_shard["s2"]["primary"]) == ("s1", "s2")
        assert by_shard["s1"]["runs"] == 1 and by_shard["s2"]["runs"] == 0
        assert [m["node"] for m in by_shard["s2"]["members"]] == ["s2"]
        assert sum(hi - lo + 1 for s in view["shards"] for lo, hi in s["slots"]) == 1024
    finally:
        await kill_all(nodes)
