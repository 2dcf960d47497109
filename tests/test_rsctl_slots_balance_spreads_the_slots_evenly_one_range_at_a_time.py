"""``rsctl slots balance`` brings every shard of the map (a registered one without slots
too) to an even share of the slots, the first shards by name one more when the count
does not divide, moving as few slots as that takes, each move one contiguous range owned
by one shard; a balanced map needs no move. ``rsctl slots move LO-HI --to SHARD`` asks
each owner of a part of the range for its part (rsctl/slotplan.py, pure)."""

from __future__ import annotations

import random

import pytest

from rsctl.slotplan import (
    balance_moves,
    move_moves,
    owned_pieces,
    parse_range,
    shares,
    slot_counts,
)
from rsproto.slots import SlotMap


def _applied(slot_map: SlotMap, moves: list[tuple[int, int, str, str]]) -> SlotMap:
    for lo, hi, source, to in moves:
        assert {owner for _, _, owner in owned_pieces(slot_map, lo, hi)} == {source}
        slot_map = slot_map.moved(lo, hi, to)
    return slot_map


def _with(shards: list[str], slot_map: SlotMap) -> SlotMap:
    return SlotMap(slot_map.slots, slot_map.epoch, slot_map.ranges,
                   {**{name: None for name in shards}, **slot_map.primaries})


def test_a_new_cluster_of_two_shards_is_balanced_by_one_move_of_the_upper_half() -> None:
    made = _with(["s2"], SlotMap.whole("s1", 1024, 1, "127.0.0.1:7001"))
    assert balance_moves(made) == [(512, 1023, "s1", "s2")]
    assert slot_counts(_applied(made, balance_moves(made))) == {"s1": 512, "s2": 512}


def test_four_shards_get_a_contiguous_quarter_each() -> None:
    made = _with(["s2", "s3", "s4"], SlotMap.whole("s1", 1024, 1))
    assert balance_moves(made) == [(256, 511, "s1", "s2"), (512, 767, "s1", "s3"),
                                   (768, 1023, "s1", "s4")]


def test_a_count_that_does_not_divide_gives_the_first_shards_one_more() -> None:
    made = _with(["b", "c"], SlotMap.whole("a", 10, 1))
    assert shares(made) == {"a": 4, "b": 3, "c": 3}
    assert slot_counts(_applied(made, balance_moves(made))) == {"a": 4, "b": 3, "c": 3}


@pytest.mark.parametrize("seed", range(20))
def test_any_map_is_balanced_by_moves_of_only_the_surplus(seed: int) -> None:
    chance = random.Random(seed)
    slots = chance.choice((7, 64, 1024, 16384))
    names = [f"s{n}" for n in range(chance.randint(1, 6))]
    made = _with(names, SlotMap.whole(names[0], slots, 1))
    for _ in range(chance.randint(0, 12)):  # a map scattered by earlier moves
        lo = chance.randrange(slots)
        made = made.moved(lo, chance.randrange(lo, slots), chance.choice(names))
    moves = balance_moves(made)
    after = _applied(made, moves)
    assert slot_counts(after) == shares(made)
    counts, target = slot_counts(made), shares(made)
    surplus = sum(max(0, counts[name] - target[name]) for name in names)
    assert sum(hi - lo + 1 for lo, hi, _, _ in moves) == surplus  # nothing moved twice
    assert balance_moves(after) == []


def test_a_move_asks_each_owner_of_a_part_of_the_range() -> None:
    made = SlotMap.whole("a", 100, 1).moved(40, 59, "b").moved(50, 54, "c")
    assert move_moves(made, 30, 69, "c") == [
        (30, 39, "a", "c"), (40, 49, "b", "c"), (55, 59, "b", "c"), (60, 69, "a", "c")]
    assert move_moves(_applied(made, move_moves(made, 30, 69, "c")), 30, 69, "c") == []


def test_a_range_is_lo_dash_hi_within_the_clusters_slots() -> None:
    assert parse_range("0-511", 1024) == (0, 511)
    assert parse_range("7") == (7, 7)
    for wrong, why in (("5-2", "LO <= HI"), ("a-b", "not a slot range"),
                       ("0-1024", "slots 0-1023"), ("-3", "not a slot range")):
        with pytest.raises(ValueError, match=why):
            parse_range(wrong, 1024)
