"""A request that names a lease of a run whose slot is moving (a settlement of its
delivery, the release of its claim, a renewal) waits for the move's end, as requests
routed by the run's slot do (rsd/wire/batches.py, slotmoves.py): executed on the source
after the run's state was exported, its change would be acknowledged and then dropped
with the run, never reaching the new owner (found by the slot-move fault tests: a
completion acknowledged by the source during the transfer, the task still RUNNING on the
target).

Two real one-node shards over one etcd; a run in the moving slots with a delivery in
flight and a held claim, and beside them tasks large enough that the move sends several
parts. The source is held (a test seam: support/moves.py) before its second part; the
completion and the release are sent then, so the source reads them while it sends the
rest; every one acknowledged is there on the new owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.moves import Seam, ask_move
from support.process import Rsd
from support.raw import raw_connect
from support.shards import led, shard_args, slot_map

from rsclient import wire
from rsproto import Op
from rsproto.slots import slot_of

SLOTS = 1024
MOVING = (0, 511)
BIG = "x" * (200 << 10)  # twelve of them: a transfer of about five parts


async def test_a_settlement_or_release_sent_during_a_slot_move_is_answered_after_it(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(size=1)
    seam = Seam(tmp_path, "slots.send_part.hold:2")
    s1, s2 = Rsd(tmp_path / "s1"), Rsd(tmp_path / "s2")
    try:
        # (the default cluster lease: nothing here waits for a takeover, and a loaded
        # machine starves a 2 s-lease primary of its keep-alives now and then)
        await s1.start(*shard_args(etcd, "s1", cluster="held", fsync="no", lease="5"),
                       env=seam.env)
        await s2.start(*shard_args(etcd, "s2", cluster="held", fsync="no", lease="5"))
        # (s1 may not lead yet when s2 has started: it answers NOT_PRIMARY until then,
        # which led() asks again)
        await led(s1.address)
        conn = await raw_connect(s1.address)
        await conn.hello("app")
        placement = next(f"p{n}" for n in range(1000)
                         if MOVING[0] <= slot_of(f"p{n}", SLOTS) <= MOVING[1])
        run = (await conn.ok(Op.SCOPE_CREATE, {"placement": placement}))["scope"]
        for name in ("work", "big"):
            await conn.ok(Op.MAILBOX_ENSURE, {"name": name})
        task = (await conn.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work",
                                               "data": 1}))["id"]
        delivery = (await conn.ok(Op.RECEIVE, {"scope": run, "mailbox": "work",
                                               "lease_seconds": 30}))["delivery"]
        claim = await conn.ok(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k",
                                                 "lease_seconds": 30})
        for _ in range(12):
            await conn.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "big", "data": BIG})

        seam.arm()
        moving = asyncio.create_task(ask_move(s1.address, *MOVING, "s2"))
        await seam.reached(lambda: s1.alive and not moving.done())
        completed = await conn.request(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"],
                                                              "outcome": {"ok": 1}})
        released = await conn.request(Op.CLAIM_RELEASE, {"lease": claim["lease"]})
        seam.release()
        done, answer = await moving
        assert done, answer
        answers = {}
        while len(answers) < 2:
            msg = await conn.recv(30)
            if msg[0] in (wire.Kind.REPLY, wire.Kind.ERROR):
                answers[msg[1]] = msg
        conn.close()

        # Whatever was acknowledged is on the new owner (once its map says it owns them:
        # the source answers the move once it switched the map, s2 learns of it later).
        deadline = asyncio.get_running_loop().time() + 30
        while (await slot_map(s2.address)).owner(MOVING[0]) != "s2":
            assert asyncio.get_running_loop().time() < deadline, "s2 never saw the move"
            await asyncio.sleep(0.05)
        there = await raw_connect(s2.address)
        await there.hello("reader")
        view = await there.ok(Op.TASK_STATUS, {"scope": run, "task": task})
        held = await there.ok(Op.CLAIM_INSPECT, {"scope": run, "key": "k"})
        there.close()
        if answers[completed][0] == wire.Kind.REPLY:
            assert view["state"] == "SUCCEEDED", (
                f"the source acknowledged the completion during the move; the new owner "
                f"has the task {view['state']}")
        if answers[released][0] == wire.Kind.REPLY:
            assert not held["held"], ("the source acknowledged the release during the "
                                      "move; the new owner holds the claim")
    finally:
        await kill_all([s1, s2])
