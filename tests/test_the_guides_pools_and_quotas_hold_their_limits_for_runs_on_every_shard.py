"""The guide's pools and quotas (``run.pool(name).run(fn)``, ``run.quota(name).take()``)
behave for runs on every shard as for runs of one server: two real one-node shards over
one etcd, the slots split between them, runs on both.

A pool lives on the shard of its name's slot and grants there to runs of every shard
(rsd/core/holds/poolbook.py, "Runs of any shard"; the SDK sends POOL_ACQUIRE and
QUOTA_TAKE by the name's slot, sdkrules.ROUTE, and keeps the slot's lease on that
shard's connection, rsclient/pools.py):
- runs of both shards contend for a pool of 2 through ``run.pool("gpu").run(fn,
  wait=True)``: from the recorded history of every fn's start and end, never more than
  2 at once, and runs of both shards held it;
- a quota of 5 is taken by runs of both shards: exactly 5 takes succeed, the others are
  QUOTA_EXHAUSTED, and its level never goes below zero;
- a run of the shard without the pool, holding a slot, is cancelled: its holder's fn is
  cancelled with LeaseLostError and the slot goes to the pool's waiter;
- a run holding a slot of a pool of the other shard moves between shards (its hold is
  not on its shard) and keeps its slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from support.etcd import EtcdCluster
from support.process import Rsd
from support.shards import halves as two_halves
from support.shards import move, placement_in, slot_map

from rsclient import AsyncRunstate, ConflictError, LeaseLostError
from rsclient.client import Scope
from rsproto.slots import SlotMap, slot_of

SLOTS = 1024


@pytest.fixture
async def halves(tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
                 ) -> AsyncIterator[tuple[SlotMap, Rsd, Rsd]]:
    """s1 and s2, each one node, each owning half of the slots; the map."""
    async with two_halves(tmp_path, etcd_cluster(size=1), "pools") as found:
        yield found


def name_on(split: SlotMap, shard: str, prefix: str) -> str:
    """A pool or quota name whose slot ``shard`` owns."""
    return f"{{{placement_in(split, shard)}}}{prefix}"


async def runs_on_both(rs: AsyncRunstate, split: SlotMap, each: int) -> list[Scope]:
    """``each`` runs on s1, then ``each`` on s2."""
    runs = []
    for shard in ("s1", "s2"):
        for _ in range(each):
            runs.append(await rs.scopes.create(placement=placement_in(split, shard)))
    return runs


async def test_a_pool_never_has_more_holders_than_its_size_across_shards(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    gpu = name_on(split, "s1", "gpu")
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.pools.ensure(gpu, size=2)
        runs = await runs_on_both(rs, split, 3)
        history: list[tuple[str, str]] = []  # ("in" | "out", run), in the order it happened

        async def use(run: Scope, n: int) -> None:
            async def fn(lease: object) -> None:
                history.append(("in", run.id))
                await asyncio.sleep(0.02)
                history.append(("out", run.id))
            for _ in range(n):
                await run.pool(gpu, lease_seconds=5).run(fn, wait=True, timeout_ms=60_000)

        await asyncio.gather(*(use(run, 4) for run in runs))
        inside, most = 0, 0
        for event, _ in history:
            inside += 1 if event == "in" else -1
            most = max(most, inside)
        assert most == 2, history  # the limit was reached, and never passed
        held_by = {slot_of(run, SLOTS) for event, run in history if event == "in"}
        assert {split.owner(slot) for slot in held_by} == {"s1", "s2"}
        assert (await rs.pools.inspect(gpu))["held"] == 0


async def test_a_quota_is_never_overspent_by_runs_of_both_shards(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    calls = name_on(split, "s2", "calls")
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.quotas.ensure(calls, limit=5, per_seconds=3600)
        runs = await runs_on_both(rs, split, 4)
        outcomes = await asyncio.gather(
            *(run.quota(calls).take(wait=False) for run in runs), return_exceptions=True)
        taken = [got for got in outcomes if isinstance(got, dict)]
        refused = [got for got in outcomes if isinstance(got, ConflictError)]
        assert (len(taken), len(refused)) == (5, 3), outcomes
        assert all(error.code == "QUOTA_EXHAUSTED" for error in refused)
        assert all(got["level"] >= 0 for got in taken)
        assert 0 <= (await rs.quotas.inspect(calls))["level"] < 1


async def test_a_cancelled_run_gives_back_its_slot_of_another_shards_pool(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    gpu = name_on(split, "s1", "gpu")
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.pools.ensure(gpu, size=1)
        far = await rs.scopes.create(placement=placement_in(split, "s2"))
        near = await rs.scopes.create(placement=placement_in(split, "s1"))
        started = asyncio.Event()

        async def hold(lease: object) -> None:
            started.set()
            await asyncio.Event().wait()  # held until its run's cancellation ends it

        holding = asyncio.create_task(far.pool(gpu).run(hold))
        began = asyncio.create_task(started.wait())
        await asyncio.wait({holding, began}, return_when=asyncio.FIRST_COMPLETED)
        if holding.done():
            began.cancel()
            holding.result()  # refused: what it says
        waiting = asyncio.create_task(
            near.pool(gpu).run(lambda lease: "mine", wait=True, timeout_ms=30_000))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await far.cancel("done with it")
        with pytest.raises(LeaseLostError):
            await holding
        assert await waiting == "mine"


async def test_a_run_holding_a_slot_of_another_shards_pool_moves_and_keeps_it(
    halves: tuple[SlotMap, Rsd, Rsd],
) -> None:
    split, s1, s2 = halves
    gpu = name_on(split, "s1", "gpu")
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.pools.ensure(gpu, size=1)
        run = await rs.scopes.create(placement=placement_in(split, "s2"))
        lease = await run.pool(gpu, lease_seconds=5).acquire()
        slot = slot_of(run.id, SLOTS)
        await move({"s1": s1.address, "s2": s2.address}, slot, slot, "s1")
        await lease.renew()  # on the pool's shard, which still holds it
        assert not lease.is_lost
        holders = (await rs.pools.inspect(gpu))["holders"]
        assert [row["run"] for row in holders] == [run.id]
        await lease.release()
        assert (await slot_map(s1.address)).owner(slot) == "s1"
