"""What ``rsctl slots move`` and ``rsctl slots balance`` do to a slot map, decided in pure
functions (no connection, no clock): the commands in slots.py carry the moves out.

What always holds:
- a move is ``(lo, hi, source, to)``: a contiguous range owned by one shard, ``source``,
  given to another, ``to``; the server of ``source``'s primary is the one asked
  (SLOTS_MOVE: a shard moves only slots it owns);
- ``balance_moves`` spreads the slots over every shard of the map (the registered ones,
  with or without slots, and those that own slots) as evenly as counts allow (the first
  shards by name get one more when the count does not divide), moving as few slots as
  that takes: a shard keeps its own slots up to its share and gives away what is over it
  from its highest slots, each surplus range handed to the shards under their share in
  order of name; applied one after the other, the moves reach the shares whatever their
  order (their ranges are disjoint).
"""

from __future__ import annotations

from rsproto.slots import SlotMap

__all__ = [
    "Move", "balance_moves", "move_moves", "owned_pieces", "parse_range", "shares", "slot_counts",
]

Move = tuple[int, int, str, str]  # lo, hi, the shard that owns them, the shard to get them


def parse_range(text: str, slots: int | None = None) -> tuple[int, int]:
    """``LO-HI`` (or one slot ``N``) as ``(lo, hi)``; ValueError saying what is wrong
    (also a range outside ``0..slots-1`` when ``slots`` is given)."""
    lo_text, dash, hi_text = text.strip().partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
    except ValueError:
        raise ValueError(f"{text!r} is not a slot range LO-HI (e.g. 0-511)") from None
    if lo < 0 or hi < lo:
        raise ValueError(f"{text!r}: a range LO-HI needs 0 <= LO <= HI")
    if slots is not None and hi >= slots:
        raise ValueError(f"{text!r}: the cluster has slots 0-{slots - 1}")
    return lo, hi


def owned_pieces(slot_map: SlotMap, lo: int, hi: int) -> list[tuple[int, int, str]]:
    """Slots ``lo``..``hi`` cut where their owner changes: ``(lo, hi, owner)``, in order."""
    return [(max(lo, start), min(hi, end), shard) for start, end, shard in slot_map.ranges
            if start <= hi and end >= lo]


def move_moves(slot_map: SlotMap, lo: int, hi: int, to: str) -> list[Move]:
    """The moves that give ``lo``..``hi`` to ``to``: one per piece another shard owns."""
    return [(start, end, owner, to) for start, end, owner in owned_pieces(slot_map, lo, hi)
            if owner != to]


def slot_counts(slot_map: SlotMap) -> dict[str, int]:
    """Every shard of the map with the number of slots it owns (0 for none)."""
    return {entry.shard: sum(end - start + 1 for start, end in entry.ranges)
            for entry in slot_map.shards()}


def shares(slot_map: SlotMap) -> dict[str, int]:
    """Each shard's even share of the slots (the first by name get one more when the
    count does not divide)."""
    names = sorted(slot_counts(slot_map))
    each, extra = divmod(slot_map.slots, len(names))
    return {name: each + (1 if n < extra else 0) for n, name in enumerate(names)}


def balance_moves(slot_map: SlotMap) -> list[Move]:
    """The moves that bring every shard to its share (the module docstring)."""
    target = shares(slot_map)
    counts = slot_counts(slot_map)
    surplus: list[tuple[int, int, str]] = []  # ranges given away, highest slots first
    for entry in slot_map.shards():
        over = counts[entry.shard] - target[entry.shard]
        for start, end in reversed(entry.ranges):
            if over <= 0:
                break
            taken = min(over, end - start + 1)
            surplus.append((end - taken + 1, end, entry.shard))
            over -= taken
    surplus.sort()
    moves: list[Move] = []
    short = [(name, target[name] - counts[name]) for name in sorted(target)
             if counts[name] < target[name]]
    for name, need in short:
        while need > 0:
            start, end, source = surplus.pop(0)
            taken = min(need, end - start + 1)
            moves.append((start, start + taken - 1, source, name))
            if taken <= end - start:
                surplus.insert(0, (start + taken, end, source))
            need -= taken
    return moves
