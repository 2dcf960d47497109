"""Shards of one cluster over one etcd, for the tests that fail a shard under load.

``shard_args`` are node ``name``'s flags in shard ``shard`` (``--fsync always``, the
cluster lease ``LEASE``); ``slot_map`` asks a node for the map (SLOT_MAP, a bare
connection); ``move`` hands a range of slots to a shard (SLOTS_MOVE, sent to the range's
owner); ``placement_in`` finds a placement whose slot a shard owns, so a workload's run
lives there; ``led`` waits until the map names a primary for each of a count of shards;
``halves`` starts two one-node shards, ``s1`` and ``s2``, each owning half of the slots.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from rsclient import wire
from rsproto.slots import SlotMap, slot_of

from .cluster import CLUSTER, LEASE, kill_all
from .etcd import EtcdCluster
from .process import Rsd
from .raw import raw_connect

__all__ = ["LED_WITHIN", "halves", "led", "move", "placement_in", "shard_args", "slot_map"]

LED_WITHIN = 30.0  # seconds for the shards to lead, generously (a loaded machine)


def shard_args(etcd: EtcdCluster, shard: str, name: str | None = None, lease: str = LEASE,
               cluster: str = CLUSTER, fsync: str = "always") -> list[str]:
    """The flags of node ``name`` (default: the shard's own name, a shard of one node) of
    shard ``shard`` of cluster ``cluster``. ``--fsync no`` for one-node shards: a primary
    alone acknowledges nothing under ``always`` (it waits for a synchronous standby)."""
    return ["--etcd", ",".join(etcd.endpoints), "--cluster", cluster, "--shard", shard,
            "--node", name or shard, "--cluster-lease-seconds", lease, "--fsync", fsync]


async def slot_map(address: str) -> SlotMap:
    """The slot map as the node at ``address`` (a primary) answers SLOT_MAP."""
    conn = await raw_connect(address)
    try:
        await conn.hello("shards")
        return SlotMap.from_wire(await conn.ok(wire.Op.SLOT_MAP, {}))
    finally:
        conn.close()


async def move(primaries: dict[str, str], lo: int, hi: int, to: str,
               timeout: float = 15.0) -> SlotMap:
    """Slots ``lo``..``hi`` handed to shard ``to`` by their owner (``primaries``: shard →
    its primary's address), and the map after."""
    any_address = next(iter(primaries.values()))
    owner = (await slot_map(any_address)).owner(lo)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while to not in (seen := await slot_map(primaries[owner])).primaries:
        # the owner knows a shard once its watch has seen that shard's first member
        assert loop.time() < deadline, f"{owner} never saw shard {to}: {seen}"
        await asyncio.sleep(0.05)
    conn = await raw_connect(primaries[owner])
    try:
        await conn.hello("shards")
        answer = await conn.call(wire.Op.SLOTS_MOVE, {"lo": lo, "hi": hi, "to": to}, timeout)
        assert answer[0] == wire.Kind.REPLY, f"SLOTS_MOVE refused: {answer!r}"
    finally:
        conn.close()
    deadline = loop.time() + timeout
    while True:  # every primary sees the new map
        maps = [await slot_map(address) for address in primaries.values()]
        if all(m.owner(lo) == to and m.owner(hi) == to for m in maps):
            return maps[0]
        assert loop.time() < deadline, f"the move was not seen everywhere: {maps}"
        await asyncio.sleep(0.05)


def placement_in(owned: SlotMap, shard: str) -> str:
    """A placement whose slot ``shard`` owns in ``owned``."""
    for n in range(100_000):
        if owned.owner(slot_of(f"p{n}", owned.slots)) == shard:
            return f"p{n}"
    raise AssertionError(f"shard {shard} owns no slot: {owned}")


async def led(address: str, shards: int = 2) -> dict[str, str]:
    """Until the map ``address`` holds names a primary for ``shards`` shards (a node
    that is not up yet is asked again): shard -> its primary's address."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LED_WITHIN
    while True:
        with contextlib.suppress(Exception):  # not up yet, or not answering the map yet
            found = await slot_map(address)
            primaries = {e.shard: e.primary for e in found.shards() if e.primary}
            if len(primaries) == shards:
                return primaries
        assert loop.time() < deadline, f"the {shards} shards did not all lead"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def halves(root: Path, etcd: EtcdCluster, cluster: str,
                 ) -> AsyncIterator[tuple[SlotMap, Rsd, Rsd]]:
    """Shards ``s1`` and ``s2`` of ``cluster``, each one node (``--fsync no``) under
    ``root``, each owning half of the slots (s1 made the map; the upper half moved to
    s2): the map, s1's node, s2's node. Both killed at the end."""
    s1, s2 = Rsd(root / "s1"), Rsd(root / "s2")
    try:
        await s1.start(*shard_args(etcd, "s1", cluster=cluster, fsync="no"))
        await s2.start(*shard_args(etcd, "s2", cluster=cluster, fsync="no"))
        await led(s1.address)
        slots = (await slot_map(s1.address)).slots
        split = await move({"s1": s1.address, "s2": s2.address}, slots // 2, slots - 1, "s2")
        yield split, s1, s2
    finally:
        await kill_all([s1, s2])
