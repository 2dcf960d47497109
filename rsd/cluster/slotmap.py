"""The slot map in etcd: ``SlotMapStore`` (which shard owns which slots, issue 32).

The key is ``/rsd/<cluster>/slotmap``, JSON ``{"slots": N, "epoch": E, "ranges": [[lo,
hi, "shard"], ...]}`` (sorted, covering every slot once: rsproto/slots.py's
``ranges_problem``). Beside it, under the same cluster prefix, each shard keeps its own
keys (etcd.py: the default shard's at the top, a named shard's under ``shards/NAME/``):
its leader and its member records say where its primary is and whether it is
registered (a shard with a live member is registered, whether it owns slots or not).

What always holds:
- the map is created once, by the first node of any shard that starts (``ensure``:
  every slot to its shard, epoch 1, put only if the key does not exist, in one
  transaction). A node whose slot count is not the cluster's is told so
  (``SlotCountMismatch``, naming both counts) before it serves: the count is fixed when
  the cluster is made;
- the map changes only by ``switch``: one transaction that compares the key's mod
  revision with the one read, so of two switches from the same map exactly one wins,
  and each change has the epoch after the one it replaced; a switch refused (the map
  moved: ``MapMoved``; the target not registered: ``UnknownShard``) or unanswered
  (``EtcdError``: it may still have been applied, the watch tells) changes nothing here;
- ``watch`` yields the map with every registered shard's primary address (its leader's
  member record's ``address``, None without a leader), now and at each change of the
  map, of a leader or of a member record; a shard with members but no slots is listed
  with no ranges. It outlives a broken stream as ``EtcdStore.watching`` does.

It reads through the node's ``EtcdStore`` (one channel, its deadlines and its member
moves); nothing here imports the server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from rsproto.slots import DEFAULT_SHARD, SlotMap, ranges_problem

from ..slotowner import SwitchRefused
from .client import EtcdError
from .etcd import SHARDS, SLOTMAP, EtcdStore, member_record

__all__ = [
    "MapMoved",
    "SlotCountMismatch",
    "SlotMapError",
    "SlotMapStore",
    "SlotMapView",
    "UnknownShard",
    "map_from_json",
    "map_to_json",
]


class SlotMapError(SwitchRefused):
    """The slot map could not be made or changed as asked (the message says why); of a
    switch, nothing in etcd was changed by it."""


class SlotCountMismatch(SlotMapError):
    """The cluster's slot count is not the one this node was started with."""


class MapMoved(SlotMapError):
    """The map is no longer at the epoch the switch was asked from."""


class UnknownShard(SlotMapError):
    """The target of a switch is not a registered shard."""


def map_to_json(slot_map: SlotMap) -> bytes:
    """The key's value for ``slot_map`` (its primaries are not stored: etcd has them)."""
    return json.dumps({"slots": slot_map.slots, "epoch": slot_map.epoch,
                       "ranges": [list(span) for span in slot_map.ranges]},
                      separators=(",", ":")).encode()


def map_from_json(value: bytes, primaries: Mapping[str, str | None] | None = None) -> SlotMap:
    """The map a key's value holds (``EtcdError`` when rsd did not write it)."""
    try:
        held = json.loads(value)
        slots, epoch, spans = held["slots"], held["epoch"], held["ranges"]
        if not isinstance(slots, int) or not isinstance(epoch, int):
            raise TypeError("slots and epoch must be integers")
        ranges = tuple((int(lo), int(hi), str(shard)) for lo, hi, shard in spans)
    except (ValueError, TypeError, KeyError) as exc:
        raise EtcdError(f"the slotmap key holds {value[:60]!r}, not a slot map: rsd did "
                        f"not write it ({exc})") from None
    problem = ranges_problem(ranges, slots)
    if problem is not None:
        raise EtcdError(f"the slotmap key holds a map rsd did not write: {problem}")
    return SlotMap(slots, epoch, ranges, dict(primaries or {}))


@dataclass(frozen=True)
class SlotMapView:
    """Everything under the cluster's prefix that the map's readers need, at one
    revision: the map as stored (None before it is made) and its mod revision, and each
    shard's leader and members' addresses."""

    revision: int
    stored: SlotMap | None = None
    map_revision: int = 0  # the slotmap key's mod revision (0: absent)
    leaders: Mapping[str, str] = field(default_factory=dict)  # shard -> leader's node
    members: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)

    @property
    def registered(self) -> set[str]:
        """The shards with a live member."""
        return {shard for shard, nodes in self.members.items() if nodes}

    def primary(self, shard: str) -> str | None:
        """The address shard ``shard``'s leader registered, or None."""
        leader = self.leaders.get(shard)
        return None if leader is None else self.members.get(shard, {}).get(leader)

    @property
    def map(self) -> SlotMap | None:
        """The map with every registered shard and every shard owning slots, each with
        its primary's address."""
        if self.stored is None:
            return None
        names = self.registered | {shard for _, _, shard in self.stored.ranges}
        primaries = {name: self.primary(name) for name in sorted(names)}
        return SlotMap(self.stored.slots, self.stored.epoch, self.stored.ranges, primaries)

    def same_state(self, other: SlotMapView | None) -> bool:
        """Whether ``other`` gives the same map (whatever else changed)."""
        return other is not None and self.map == other.map


class SlotMapStore:
    """The slot map of ``store``'s cluster (see the module docstring), read and changed
    through ``store``'s channel."""

    def __init__(self, store: EtcdStore) -> None:
        self.store = store
        self.prefix = store.cluster_prefix
        self.key = self.prefix + SLOTMAP

    async def view(self) -> SlotMapView:
        """The map and every shard's leader and members, read at one revision."""
        got = await self.store.call(self.store.channel().get_prefix(self.prefix),
                                    "a read of the slot map")
        stored: SlotMap | None = None
        map_revision = 0
        leaders: dict[str, str] = {}
        members: dict[str, dict[str, str | None]] = {}
        for kv in got.kvs:
            name = bytes(kv.key)[len(self.prefix):]
            if name == SLOTMAP:
                stored, map_revision = map_from_json(bytes(kv.value)), int(kv.mod_revision)
                continue
            shard, own = _shard_key(name)
            if own == b"leader":
                leaders[shard] = bytes(kv.value).decode(errors="replace")
            elif own.startswith(b"members/"):
                record = member_record(bytes(kv.value))
                if record is not None:
                    address = record.get("address")
                    members.setdefault(shard, {})[str(record["name"])] = (
                        address if isinstance(address, str) else None)
        return SlotMapView(int(got.header.revision), stored, map_revision, leaders, members)

    async def current(self) -> SlotMap | None:
        """The map now, with primaries (None before it is made)."""
        return (await self.view()).map

    async def ensure(self, slots: int, shard: str | None) -> SlotMap:
        """The cluster's map, made now if absent (every slot to ``shard``, None meaning
        the default shard, epoch 1); ``SlotCountMismatch`` when the cluster's has
        another slot count than ``slots``."""
        owner = DEFAULT_SHARD if shard is None else shard
        client = self.store.channel()
        tx = client.transactions
        first = SlotMap.whole(owner, slots, 1)
        await self.store.call(client.transaction(
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, map_to_json(first))],
            failure=[],
        ), "the first slot map")
        view = await self.view()
        made = view.map
        if made is None:  # (nothing deletes the key: rsd did not)
            raise EtcdError("the slotmap key went as soon as it was made: rsd did not delete it")
        if made.slots != slots:
            raise SlotCountMismatch(
                f"cluster {self.store.cluster} has {made.slots} slots (fixed when it was made, "
                f"kept in etcd at {self.key.decode()}); this node was started with "
                f"--slots {slots}: start it with --slots {made.slots}")
        return made

    async def watch(self) -> AsyncIterator[SlotMap]:
        """The map now (once made), then at each change of it, of a shard's leader or of
        a member record: each with every shard's primary (the module docstring)."""
        async for view in self.store.watching(self.prefix, self.view, _read_here):
            made = view.map
            if made is not None:
                yield made

    async def switch(self, lo: int, hi: int, to: str, expected_epoch: int) -> SlotMap:
        """Give slots ``lo``..``hi`` to shard ``to`` if the map is still at
        ``expected_epoch`` (compare-and-swap); the new map. ``MapMoved``,
        ``UnknownShard``, ``SlotMapError`` (no map, slots out of range) or ``EtcdError``
        otherwise, and then nothing was changed by this call (but see the module
        docstring on an unanswered one)."""
        try:
            view = await self.view()
        except EtcdError as exc:  # before the compare-and-swap: nothing was asked
            raise SlotMapError(str(exc)) from None
        stored = view.map
        if stored is None:
            raise SlotMapError(f"cluster {self.store.cluster} has no slot map yet")
        if stored.epoch != expected_epoch:
            raise MapMoved(f"the slot map is at epoch {stored.epoch}, not {expected_epoch}")
        if to not in view.registered and to not in {s for _, _, s in stored.ranges}:
            raise UnknownShard(f"shard {to!r} is not registered in cluster "
                               f"{self.store.cluster} (no live member, no slots)")
        try:
            moved = stored.moved(lo, hi, to)
        except ValueError as exc:
            raise SlotMapError(str(exc)) from None
        client = self.store.channel()
        tx = client.transactions
        won, _ = await self.store.call(client.transaction(
            compare=[tx.mod(self.key) == view.map_revision],
            success=[tx.put(self.key, map_to_json(moved))],
            failure=[],
        ), "a switch of the slot map")
        if not won:
            raise MapMoved(f"the slot map moved on from epoch {expected_epoch} meanwhile")
        return moved


def _shard_key(name: bytes) -> tuple[str, bytes]:
    """The shard a key under the cluster's prefix belongs to, and the key under that
    shard's prefix."""
    if name.startswith(SHARDS):
        shard, _, own = name[len(SHARDS):].partition(b"/")
        return shard.decode(errors="replace"), own
    return DEFAULT_SHARD, name


def _read_here(name: bytes) -> bool:
    """Whether a change of the key ``name`` (under the cluster's prefix) can change the
    map's view: the map itself, a leader key, a member record."""
    if name == SLOTMAP:
        return True
    own = _shard_key(name)[1]
    return own == b"leader" or own.startswith(b"members/")
