"""A standby promoted to primary runs the core's timers from its first moment as primary,
whether or not a client ever connects to it: what its copy holds falls due on time.

A standby never ticks (it follows: the primary's records say what expired); promoted,
its core's deadlines become the server's to run. The server arms its timer when it
starts serving whatever state it was given (``Server.start``, the one place for a
recovered and a promoted state alike); before, the timer was armed only after a
client's request, so an idle cluster whose primary failed over in the night ran no
schedule, no delay and no lease expiry until someone came.

The promotion is the node's own (``ClusterNode._become``), without etcd: the node is
told it leads, as the elector would after winning the election.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

from support.aio import eventually_true

from rsd.cluster.etcd import EtcdStore
from rsd.core import Core
from rsd.core.run.items import State
from rsd.disk.snapshots import Snapshots
from rsd.replication.follower import Standby
from rsd.replication.node import ClusterNode
from rsd.server import Server
from rsd.startup import replay
from rsproto import Op


def _new_core(loop: asyncio.AbstractEventLoop) -> Core:
    return Core(lambda: "run-1", wall_offset=time.time() - loop.time())


async def test_a_promoted_standby_fires_what_falls_due_with_no_client(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    primary = _new_core(loop)  # the old primary: its records are what the standby holds
    primary.connected(1, "planner")
    now = loop.time()
    primary.handle(now, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    primary.handle(now, 1, 2, Op.SCOPE_CREATE, {"scope": "nightly"})
    submitted = primary.handle(now, 1, 3, Op.TASK_SUBMIT, {
        "scope": "nightly", "mailbox": "jobs", "data": {"n": 1}, "delay_ms": 200})

    copy = _new_core(loop)
    journal, _ = replay(tmp_path, copy, now)
    for rec in primary.effects.take_records():
        copy.apply(rec, now)
    item = copy.work.items[submitted["id"]]
    assert item.state is State.DELAYED

    def new_server(core: Core, journal: Any, snapshots: Any, feeds: Any,
                   on_lapsed: Any) -> Server:
        return Server(core, loop, journal=journal, snapshots=snapshots, feeds=feeds,
                      cluster="test", on_lapsed=on_lapsed)

    store = EtcdStore(["127.0.0.1:1"], "test", "n2", lease_seconds=5)  # never connected
    node = ClusterNode(store, "127.0.0.1:1", tmp_path, lambda: _new_core(loop), new_server,
                       policy="always", snapshot_bytes=1 << 30, token=None)
    node.follower.hold(Standby(copy, journal, Snapshots(journal, copy), epoch=1, last=1))
    node.listener = await loop.create_server(node.protocol, "127.0.0.1", 0,
                                             start_serving=False)
    node.elector._primary = True  # as winning the election of epoch 2 leaves it
    node.elector._deadline = math.inf
    try:
        await node._become(2)
        assert node.server is not None and node.server.core is copy
        await eventually_true(lambda: item.state is State.PENDING)  # no client came
        assert node.server.conns == {}
    finally:
        if node.server is not None:
            await node.server.stop()
        node.listener.close()
