"""A cluster node reads its own directory at start (rsd/replication/node.py ``load``), and
what it says decides what the node may do (core/streamat.py keeps it with the state):

- a standby's directory (its copy, then each batch it acknowledged) holds the primary's
  state up to its last batch: restarted, the standby holds it again, follows on from
  that batch without a new copy, and, still named the synchronous standby, may lead
  (its directory has every change the primary acknowledged);
- a primary's own directory says which epoch it led: the node that won the current
  epoch may lead again from it, but not from a directory that was emptied or is older
  (it would serve a state without what it acknowledged).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
from pathlib import Path
from typing import Any

from support.aio import eventually_true

from rsclient import AsyncRunstate
from rsd.cluster.etcd import ClusterView, EtcdStore
from rsd.core import Core, Rec
from rsd.core.records import StreamAt
from rsd.disk.snapshots import Snapshots
from rsd.replication.follower import Follower
from rsd.replication.node import ClusterNode
from rsd.server import Server
from rsd.startup import recover, replay
from rsd.wire.feeds import Feeds

CLUSTER = "test"


def _new_core() -> Core:
    ids = itertools.count(1)
    return Core(lambda: f"run-{next(ids)}", wall_offset=0.0)


def _state(core: Core) -> list[Any]:
    return [list(rec) for rec in core.snapshot() if rec[0] != Rec.STREAM_AT]


def _node(directory: Path, name: str = "n2") -> ClusterNode:
    store = EtcdStore(["127.0.0.1:1"], CLUSTER, name, lease_seconds=5)  # never connected
    return ClusterNode(store, "127.0.0.1:1", directory, _new_core, lambda *a: None,
                       policy="always", snapshot_bytes=1 << 30, token=None)


def _may_lead(node: ClusterNode, **view: Any) -> bool:
    node.elector._view = ClusterView(revision=1, **view)  # as a read of etcd would set it
    return node.may_lead()


async def test_a_restarted_standby_holds_its_directory_and_follows_on_without_a_copy(
    tmp_path: Path,
) -> None:
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    loop = asyncio.get_running_loop()
    core = _new_core()
    journal, _ = recover(tmp_path / "primary", core, loop.time())
    journal.write(core.effects.take_records())
    core.effects.take_sync()
    server: Server | None = None

    def acked() -> None:
        if server is not None and server.commit is not None:
            server.commit.acked()

    feeds = Feeds(core, loop, lambda: 3, acked, lambda node: loop.call_soon(feeds.named, node))
    server = Server(core, loop, journal=journal, snapshots=Snapshots(journal, core),
                    feeds=feeds, cluster=CLUSTER, on_lapsed=lambda: None)
    host, port = await server.start("127.0.0.1", 0)
    rs = AsyncRunstate(holder="planner", address=f"{host}:{port}")
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    following = asyncio.create_task(follower.follow(host, port))
    try:
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        for index in range(5):
            await run.mailbox("research").submit({"n": index}, key=f"a{index}")
        held = follower.standby
        assert held is not None and held.epoch == 3
        following.cancel()  # the standby stops (a crash: nothing closed cleanly)
        with contextlib.suppress(asyncio.CancelledError):
            await following
        last = held.last
        await eventually_true(lambda: not feeds.feeds)

        node = _node(tmp_path / "standby")  # the same directory, a new process
        node.load(loop.time())
        again = node.follower.standby
        assert again is not None and (again.epoch, again.last) == (3, last)
        assert again.core.stream_mark.at == StreamAt(Rec.STREAM_AT, 3, last, False)
        assert _state(again.core) == _state(core)
        assert node.own is None
        # Named the synchronous standby of epoch 3, it holds all that was acknowledged.
        assert _may_lead(node, epoch=3, sync="n2", last_leader="n1")
        assert not _may_lead(node, epoch=3, sync="n3", last_leader="n1")
        assert not _may_lead(node, epoch=4, sync="n2", last_leader="n3")

        waiting = asyncio.ensure_future(run.mailbox("research").submit({"n": 9}, key="b"))
        following = asyncio.create_task(node.follower.follow(host, port))
        await asyncio.wait_for(waiting, 10)  # acknowledged on its word: it resumed
        assert node.follower.standby is again and node.follower.copies == 0
        await eventually_true(lambda: again.last == feeds.written)
        assert _state(again.core) == _state(core)
        following.cancel()
        node.follower.close()
    finally:
        following.cancel()
        await rs.close()
        await server.stop()
        follower.close()


async def test_the_primary_of_the_epoch_leads_again_only_from_a_directory_that_says_so(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    directory = tmp_path / "n1"
    directory.mkdir()
    core = _new_core()
    journal, _ = recover(directory, core, loop.time())
    core.stream_mark.led(7, loop.time())  # as node.py does when it becomes the primary
    journal.write(core.effects.take_records())
    journal.sync_now()
    journal.close()

    node = _node(directory, "n1")
    node.load(loop.time())
    assert node.own is not None and node.own.led == 7 and node.follower.standby is None
    assert _may_lead(node, epoch=7, last_leader="n1", sync="n2")
    assert not _may_lead(node, epoch=8, last_leader="n1", sync="n2")  # not its epoch
    assert not _may_lead(node, epoch=7, last_leader="n3", sync="n2")
    node.own.journal.close()

    older = tmp_path / "older"  # a directory from before it led (a restored backup)
    older.mkdir()
    journal, _ = replay(older, _new_core(), loop.time())
    journal.close()
    restored = _node(older, "n1")
    restored.load(loop.time())
    assert not _may_lead(restored, epoch=7, last_leader="n1", sync="n2")
    assert restored.own is not None
    restored.own.journal.close()

    shutil.rmtree(directory)  # emptied
    directory.mkdir()
    emptied = _node(directory, "n1")
    emptied.load(loop.time())
    assert not _may_lead(emptied, epoch=7, last_leader="n1", sync="n2")
    assert _may_lead(emptied, epoch=0)  # a cluster that never had a primary
    assert emptied.own is not None
    emptied.own.journal.close()
