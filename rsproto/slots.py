"""Slots: how a sharded cluster spreads runs over its shards, declared once for the
server and every SDK.

A cluster has a fixed number of slots (``slots``, chosen when it is first made, default
``DEFAULT_SLOTS``). A run belongs to one slot for its whole life: the slot of its id.
A pool or a quota belongs to the slot of its name. ``slot_of`` is the rule (protocol.md,
"Slots", states it with test vectors that every SDK is tested on):

- the *hash tag* of a key is the part between its first ``{`` and the first ``}`` after
  it, if that part is not empty; otherwise the whole key (Redis Cluster's rule, so that
  ``{acme}7f3a`` and ``{acme}gpu`` share a slot);
- its slot is the CRC-32 (ISO-HDLC, zlib's and PNG's: polynomial 0xEDB88320 reflected,
  initial and final XOR 0xFFFFFFFF) of the tag's UTF-8 bytes, modulo ``slots``.

A run created with a *placement* (``rs.scopes.create(placement="acme")``) is given the
fresh id ``{acme}`` followed by 24 hexadecimal digits: its slot is the placement's, so a
client routes every request of the run without asking anyone (the id carries its tag).

The *slot map* says which shard owns which slots: ranges ``[lo, hi]`` (both included)
covering every slot exactly once, each owned by one shard, and the map's ``epoch``,
which grows by one with each change (etcd holds the map; the change is a
compare-and-swap on it). ``SlotMap`` is the map as the SLOT_MAP op answers it, with each
shard's primary address, read the same way by the server's shell and the SDKs.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "DEFAULT_SHARD",
    "DEFAULT_SLOTS",
    "MAX_PLACEMENT_BYTES",
    "MAX_SLOTS",
    "SLOT_VECTORS",
    "ShardEntry",
    "SlotMap",
    "hash_tag",
    "placed_id",
    "placement_problem",
    "ranges_problem",
    "slot_of",
]

DEFAULT_SLOTS = 1024  # --slots' default
MAX_SLOTS = 16384  # the most slots a cluster may have (Redis Cluster's count)
DEFAULT_SHARD: Final = "default"  # the shard of nodes started without --shard (today's cluster)
MAX_PLACEMENT_BYTES = 64  # a placement's UTF-8 bytes at most (the id stays under 128)


def hash_tag(key: str) -> bytes:
    """The UTF-8 bytes of ``key`` that decide its slot (see the module docstring)."""
    raw = key.encode("utf-8")
    opening = raw.find(b"{")
    if opening >= 0:
        closing = raw.find(b"}", opening + 1)
        if closing > opening + 1:
            return raw[opening + 1:closing]
    return raw


def slot_of(key: str, slots: int) -> int:
    """The slot of a run id, a pool's or a quota's name, or a placement, of ``slots``."""
    return zlib.crc32(hash_tag(key)) % slots


def placement_problem(placement: object) -> str | None:
    """Why ``placement`` cannot place a run (None: it can)."""
    if not isinstance(placement, str):
        return "placement must be a string"
    size = len(placement.encode("utf-8"))
    if not 1 <= size <= MAX_PLACEMENT_BYTES:
        return f"placement must be 1 to {MAX_PLACEMENT_BYTES} UTF-8 bytes (got {size})"
    if "{" in placement or "}" in placement:
        return "placement must not contain '{' or '}'"
    return None


def placed_id(placement: str | None, fresh_hex: str) -> str:
    """A fresh run id: ``fresh_hex`` (24 hexadecimal digits), tagged with ``placement``."""
    return fresh_hex if placement is None else "{" + placement + "}" + fresh_hex


def ranges_problem(ranges: Sequence[Sequence[Any]], slots: int) -> str | None:
    """Why ``ranges`` ([lo, hi, shard], sorted) do not cover 0..slots-1 exactly once
    (None: they do)."""
    expected = 0
    for entry in ranges:
        if len(entry) != 3:
            return f"a range must be [lo, hi, shard], got {entry!r}"
        lo, hi, shard = entry
        if not (isinstance(lo, int) and isinstance(hi, int) and isinstance(shard, str)):
            return f"a range must be [lo, hi, shard], got {entry!r}"
        if lo != expected or hi < lo:
            return f"ranges must cover every slot once, in order: [{lo}, {hi}] after {expected}"
        expected = hi + 1
    if expected != slots:
        return f"ranges cover {expected} slots of {slots}"
    return None


@dataclass(frozen=True)
class ShardEntry:
    """One shard of the map: its name, its primary's ``HOST:PORT`` (None: none now, or
    this very server when it runs alone), and its ranges."""

    shard: str
    primary: str | None
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SlotMap:
    """The slot map at one epoch (see the module docstring). ``ranges``: sorted
    ``(lo, hi, shard)`` covering every slot once; ``primaries``: shard → its primary's
    address (a shard may own no slot and still be listed)."""

    slots: int
    epoch: int
    ranges: tuple[tuple[int, int, str], ...]
    primaries: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def whole(cls, shard: str = DEFAULT_SHARD, slots: int = DEFAULT_SLOTS, epoch: int = 0,
              primary: str | None = None) -> SlotMap:
        """Every slot owned by ``shard``: a server alone, or a new cluster's first map."""
        return cls(slots, epoch, ((0, slots - 1, shard),), {shard: primary})

    def owner(self, slot: int) -> str:
        """The shard that owns ``slot`` (a binary search over the ranges)."""
        low, high = 0, len(self.ranges) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self.ranges[middle][0] <= slot:
                low = middle
            else:
                high = middle - 1
        return self.ranges[low][2]

    def owner_of(self, key: str) -> str:
        """The shard that owns the slot of ``key`` (a run id, a pool's name...)."""
        return self.owner(slot_of(key, self.slots))

    def shards(self) -> list[ShardEntry]:
        """Every shard, by name, with its ranges (merged where adjacent)."""
        names = set(self.primaries) | {shard for _, _, shard in self.ranges}
        owned: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
        for lo, hi, shard in self.ranges:
            spans = owned[shard]
            if spans and spans[-1][1] + 1 == lo:
                spans[-1] = (spans[-1][0], hi)
            else:
                spans.append((lo, hi))
        return [ShardEntry(name, self.primaries.get(name), tuple(owned[name]))
                for name in sorted(names)]

    def moved(self, lo: int, hi: int, to: str) -> SlotMap:
        """This map with slots ``lo``..``hi`` given to ``to``, at the next epoch."""
        if not 0 <= lo <= hi < self.slots:
            raise ValueError(f"slots {lo}-{hi} are not within 0-{self.slots - 1}")
        spans: list[tuple[int, int, str]] = []
        for start, end, shard in self.ranges:
            for piece in ((start, min(end, lo - 1)), (max(start, hi + 1), end)):
                if piece[0] <= piece[1]:
                    spans.append((piece[0], piece[1], shard))
        spans.append((lo, hi, to))
        return SlotMap(self.slots, self.epoch + 1, _merged(sorted(spans)),
                       {**self.primaries, to: self.primaries.get(to)})

    def to_wire(self) -> dict[str, Any]:
        """The SLOT_MAP reply: ``slots``, ``map_epoch`` and ``shards`` (protocol.md)."""
        return {"slots": self.slots, "map_epoch": self.epoch,
                "shards": [{"shard": entry.shard, "primary": entry.primary,
                            "ranges": [list(span) for span in entry.ranges]}
                           for entry in self.shards()]}

    @classmethod
    def from_wire(cls, reply: Mapping[str, Any]) -> SlotMap:
        """A SLOT_MAP reply as a map (ValueError when it is not one)."""
        slots, epoch, shards = reply.get("slots"), reply.get("map_epoch"), reply.get("shards")
        if not isinstance(slots, int) or not isinstance(epoch, int) or not isinstance(shards, list):
            raise ValueError("a slot map has integer slots and map_epoch and a list of shards")
        spans: list[tuple[int, int, str]] = []
        primaries: dict[str, str | None] = {}
        for entry in shards:
            name, primary = entry.get("shard"), entry.get("primary")
            if not isinstance(name, str) or not (primary is None or isinstance(primary, str)):
                raise ValueError(f"a shard of the map is malformed: {entry!r}")
            primaries[name] = primary
            spans += [(int(lo), int(hi), name) for lo, hi in entry.get("ranges") or ()]
        ranges = _merged(sorted(spans))
        problem = ranges_problem(ranges, slots)
        if problem is not None:
            raise ValueError(problem)
        return cls(slots, epoch, ranges, primaries)


def _merged(spans: Iterable[tuple[int, int, str]]) -> tuple[tuple[int, int, str], ...]:
    """Sorted ``spans`` with adjacent ones of the same shard joined."""
    out: list[tuple[int, int, str]] = []
    for lo, hi, shard in spans:
        if out and out[-1][2] == shard and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi, shard)
        else:
            out.append((lo, hi, shard))
    return tuple(out)


# Test vectors: [key, slots, slot]. protocol.md lists them; both SDKs are tested on them.
SLOT_VECTORS: tuple[tuple[str, int, int], ...] = tuple(
    (key, slots, slot_of(key, slots))
    for key, slots in (
        ("123456789", 1024), ("123456789", 16384), ("", 1024), ("a", 1024),
        ("4f2a9c1e7b3d5a6f8e0c2b1d", 1024), ("{acme}4f2a9c1e7b3d5a6f8e0c2b1d", 1024),
        ("acme", 1024), ("{acme}gpu", 1024), ("{}acme", 1024), ("{acme", 1024),
        ("acme}{", 1024), ("x{acme}y{other}", 1024), ("räksmörgås", 1024),
        ("ünïcødé{τag}", 1024), ("run-42", 2), ("run-42", 1), ("run-42", 16384),
    )
)
