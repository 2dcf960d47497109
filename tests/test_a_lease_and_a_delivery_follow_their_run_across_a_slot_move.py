"""A claim held, and a consume() worker's delivery in flight, while ``rsctl slots move``
takes their run to another shard, go on there (the SDK's half of "leases follow their
run": rsclient/keeper.py, leases.py, deliveries.py; the server's: rsd/core/ground/
forwarded.py), between two real one-node shards over one etcd:

- the claim stays held: its keeper's renewal on the old shard is answered "MOVED", it is
  kept and renewed on the new shard from then on (no LeaseLostError, the same
  generation, still held there a lease length and a second after the move, which only
  renewals there explain: the import gave it one lease); a second claim, not renewed
  before its release, is released on the new shard through its old one's MOVED;
- the worker's handler, still running after the move, completes its delivery: the
  delivery's lease followed its run when its renewal was answered MOVED, so the
  completion goes to the new shard and is recorded there, once (the task SUCCEEDED with
  the handler's result on its first attempt, the handler ran once); a delivery received
  by hand (not renewed) is completed through its old shard's MOVED, on the new one;
- the old shard answers a moved handle "MOVED" for the lease's length after the move
  (the second claim's 30 s), then STALE_CLAIM (the first claim's 3 s, long past); a lease
  a shard never had (granted by the other one) is STALE_CLAIM there, not MOVED.

The leases that cross the move are ``TAKEOVER_LEASE`` long (3 s, the shards started with
``SHORT_LEASES``): the test waits out one of them, and a second, in real time.

Before the change the claim was lost at its first renewal after the move (STALE_CLAIM
from the old shard) and the completion was refused there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.process import SHORT_LEASES, TAKEOVER_LEASE, Rsd
from support.raw import raw_connect
from support.shards import led, move, shard_args

from rsclient import AsyncRunstate, wire
from rsproto.slots import slot_of

SLOTS = 1024
LO, HI = 0, 511  # the moved range: s1 owns every slot before
WITHIN = 30.0  # seconds for both shards to lead, generously (a loaded machine)
# The leases that cross the move (support/process.py's TAKEOVER_LEASE, on shards started
# with SHORT_LEASES): renewed every second and lost 2 s after the send of the last
# confirmed renewal, so following one (a SLOT_MAP, a connection to the new shard, a
# renewal there) has about a second on a loaded machine, and the test's wait of a lease
# length and a second is 4 s, not the protocol's shortest lease's 6 s.
LEASE = TAKEOVER_LEASE


def placement(lo: int, hi: int, prefix: str) -> str:
    return next(f"{prefix}{n}" for n in range(100_000)
                if lo <= slot_of(f"{{{prefix}{n}}}", SLOTS) <= hi)


@pytest.fixture
async def shards(tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
                 ) -> AsyncIterator[dict[str, str]]:
    """s1 (made the map: every slot) and s2 (none), one node each: shard -> address."""
    etcd = etcd_cluster(size=1)
    s1, s2 = Rsd(tmp_path / "s1"), Rsd(tmp_path / "s2")
    try:
        await s1.start(*shard_args(etcd, "s1", cluster="follow", fsync="no"), *SHORT_LEASES)
        await s2.start(*shard_args(etcd, "s2", cluster="follow", fsync="no"), *SHORT_LEASES)
        yield await led(s1.address)
    finally:
        await kill_all([s1, s2])


async def renewed(address: str, handle: bytes) -> Any:
    """LEASE_RENEW of ``handle`` on a bare connection to ``address``: its item's outcome."""
    conn = await raw_connect(address)
    try:
        await conn.hello("probe")
        return (await conn.ok(wire.Op.LEASE_RENEW, {"leases": [handle]}))["results"][0]
    finally:
        conn.close()


async def until_not_moved(address: str, handle: bytes) -> None:
    """Until ``address`` answers a renewal of ``handle`` other than MOVED (generously
    bounded: only a failure waits it out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEASE + WITHIN
    while await renewed(address, handle) == "MOVED":
        assert loop.time() < deadline, "the old shard answered MOVED past the lease's length"
        await asyncio.sleep(0.1)


async def test_a_held_claim_and_a_running_delivery_go_on_on_their_runs_new_shard(
    shards: dict[str, str],
) -> None:
    async with AsyncRunstate(holder="app", address=f"{shards['s1']},{shards['s2']}") as rs:
        await rs.mailboxes.ensure("work", mode="WORK")
        moving = await rs.scopes.create(placement=placement(LO, HI, "m"))
        elsewhere = await rs.scopes.create(placement=placement(HI + 1, SLOTS - 1, "e"))
        lease = await moving.claim("k", lease_seconds=LEASE).acquire()
        quiet = await moving.claim("q", lease_seconds=30).acquire()  # no renewal before its end
        started, finish = asyncio.Event(), asyncio.Event()
        runs: list[Any] = []

        async def handler(data: Any, delivery: Any) -> None:
            runs.append(data)
            started.set()
            await finish.wait()
            await delivery.complete(result={"payload": {"done": data["n"]}})

        await rs.mailboxes.ensure("manual", mode="WORK")
        manual = moving.mailbox("manual")
        by_hand = await manual.submit({"n": 2})
        taken = await manual.receive(lease_seconds=30)  # not renewed: settled after the move
        assert taken is not None
        work = moving.mailbox("work")
        worker = asyncio.create_task(work.consume(handler, lease_seconds=LEASE))
        ticket = await work.submit({"n": 1})
        await asyncio.wait_for(started.wait(), WITHIN)

        await move(shards, LO, HI, "s2")
        moved_at = asyncio.get_running_loop().time()  # s2 imported the runs before this
        assert await renewed(shards["s1"], quiet.handle) == "MOVED"  # for its 30 s, on s1
        # A lease length after the move, s1 forgets the claim's handle (its forwarded
        # handles lapse then): asked until it does, a loaded machine's timer being late.
        await until_not_moved(shards["s1"], lease.handle)
        assert await renewed(shards["s1"], lease.handle) == "STALE_CLAIM"
        # A lease and a second after the import (which gave the lease one full lease on
        # s2): held there only if renewed there; renewals were due on the old shard,
        # several over.
        await asyncio.sleep(max(0.0, moved_at + LEASE + 1 - asyncio.get_running_loop().time()))
        assert not lease.is_lost, lease.lost_reason
        view = await moving.claim("k").inspect()  # on s2 now
        assert view["held"] and view["generation"] == lease.generation
        await quiet.release()  # sent to s1 (its keeper never renewed it): MOVED, then s2
        assert not (await moving.claim("q").inspect())["held"]

        finish.set()  # the handler completes its delivery, on s2
        done = await ticket.result(timeout_ms=int(WITHIN * 1000))
        assert done["state"] == "SUCCEEDED" and done["outcome"] == {"done": 1}
        assert (await ticket.status())["attempt"] == 1 and runs == [{"n": 1}]
        await taken.complete(result={"payload": "by hand"})  # to s1: MOVED, then s2
        assert (await by_hand.result())["outcome"] == "by hand"
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

        other = await elsewhere.claim("k", lease_seconds=30).acquire()  # granted by s1
        assert await renewed(shards["s2"], other.handle) == "STALE_CLAIM"  # never s2's
        assert not lease.is_lost
        await lease.release()
        await other.release()
