"""A move of slots that hold runs whose target's primary cannot be reached (the map still
names it: its node was just killed, and its leader key lives until its etcd lease ends)
is answered UNAVAILABLE saying so, and rolls back: the source keeps and serves its runs
(rsd/wire/slotimport.py, ``ImportChannel.open``). Before, the refused connect escaped
the move as an OSError: the move's task died, the slots were let go, and SLOTS_MOVE was
never answered (``rsctl slots move`` waited out its timeout). Found while writing the
slot-move fault tests (a move asked again right after the target's primary was killed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.moves import ask_move
from support.process import Rsd
from support.raw import raw_connect
from support.shards import led, shard_args, slot_map

from rsproto import Op
from rsproto.slots import slot_of

SLOTS = 1024


async def test_a_move_whose_target_cannot_be_reached_is_refused_and_the_runs_stay(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(size=1)
    s1, s2 = Rsd(tmp_path / "s1"), Rsd(tmp_path / "s2")
    try:
        # A long cluster lease: the map names s2's primary well after it is killed.
        await s1.start(*shard_args(etcd, "s1", cluster="gone", fsync="no", lease="10"))
        await s2.start(*shard_args(etcd, "s2", cluster="gone", fsync="no", lease="10"))
        await led(s1.address)  # (a node named in the map may answer NOT_PRIMARY a moment)
        conn = await raw_connect(s1.address)
        await conn.hello("app")
        placement = next(f"p{n}" for n in range(1000) if slot_of(f"p{n}", SLOTS) <= 511)
        run = (await conn.ok(Op.SCOPE_CREATE, {"placement": placement}))["scope"]
        await conn.ok(Op.MAILBOX_ENSURE, {"name": "work"})
        await s2.kill()
        assert (await slot_map(s1.address)).primaries["s2"] == s2.address

        done, answer = await ask_move(s1.address, 0, 511, "s2", timeout=15)
        assert not done and answer[0] == "UNAVAILABLE", answer
        assert "could not be reached" in answer[1], answer
        assert (await slot_map(s1.address)).owner(slot_of(run, SLOTS)) == "s1"
        task = await conn.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work", "data": 1})
        assert task["state"] == "PENDING"
        conn.close()
    finally:
        await kill_all([s1, s2])
