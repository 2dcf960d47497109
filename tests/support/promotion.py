"""A standby promoted to primary by the node's own path (``ClusterNode._become``), without
etcd: what a takeover does to a state, for tests that need no real election (a cluster
with one costs a suite much more, and its records are streamed like any other).

``new_core(loop)`` makes a core whose wall clock is the loop's; ``promoted(tmp_path,
primary)`` replays the old primary's journal in ``tmp_path`` and applies its records not
yet taken into a copy (what a standby's stream brings), promotes a node holding that copy
as the winner of epoch 2, and yields the copy; the node's server is stopped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rsd.cluster.etcd import EtcdStore
from rsd.core import Core
from rsd.disk.snapshots import Snapshots
from rsd.replication.follower import Standby
from rsd.replication.node import ClusterNode
from rsd.server import Server
from rsd.startup import replay

__all__ = ["new_core", "promoted", "standby_copy"]


def new_core(loop: asyncio.AbstractEventLoop) -> Core:
    """A core whose wall clock is ``loop``'s."""
    return Core(lambda: "run-1", wall_offset=time.time() - loop.time())


def standby_copy(tmp_path: Path, primary: Core, now: float) -> tuple[Core, Any]:
    """What a standby of ``primary`` holds: its journal in ``tmp_path`` replayed, then its
    records not yet taken applied; the copy and its journal."""
    copy = new_core(asyncio.get_running_loop())
    journal, _ = replay(tmp_path, copy, now)
    for rec in primary.effects.take_records():
        copy.apply(rec, now)
    return copy, journal


@contextlib.asynccontextmanager
async def promoted(tmp_path: Path, copy: Core, journal: Any) -> AsyncIterator[Server]:
    """A node holding ``copy`` (``standby_copy``'s) promoted as the winner of epoch 2:
    its server, serving ``copy``, which no client has reached."""
    loop = asyncio.get_running_loop()

    def new_server(core: Core, journal: Any, snapshots: Any, feeds: Any,
                   on_lapsed: Any) -> Server:
        return Server(core, loop, journal=journal, snapshots=snapshots, feeds=feeds,
                      cluster="test", on_lapsed=on_lapsed)

    store = EtcdStore(["127.0.0.1:1"], "test", "n2", lease_seconds=5)  # never connected
    node = ClusterNode(store, "127.0.0.1:1", tmp_path, lambda: new_core(loop), new_server,
                       policy="always", snapshot_bytes=1 << 30, token=None)
    node.follower.hold(Standby(copy, journal, Snapshots(journal, copy), epoch=1, last=1))
    node.listener = await loop.create_server(node.protocol, "127.0.0.1", 0,
                                             start_serving=False)
    node.elector._primary = True  # as winning the election of epoch 2 leaves it
    node.elector._deadline = math.inf
    try:
        await node._become(2)
        assert node.server is not None and node.server.core is copy
        yield node.server
    finally:
        if node.server is not None:
            await node.server.stop()
        node.listener.close()
