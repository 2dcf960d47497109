"""The HTTP listener's places (httpplaces.py), rule by rule, on the pure table: no sockets,
the loop's turns told by hand. A newcomer over a share or when every place is taken
takes the place of the holder that has waited longest for its whole request; a whole
request is never displaced while a slow one can go; a holder is slow once part of its
request was read, or after two turns with nothing read, never before; the network
holding the most pays first; with no slow holder, the old balance between networks;
otherwise the newcomer is refused.
"""

from __future__ import annotations

from rsd.http.httpplaces import Places


def full(places: Places[str], hosts: list[str]) -> None:
    """Each of ``hosts`` holds a place and has sent half a request."""
    for n, host in enumerate(hosts):
        assert places.admit(f"slow-{n}", host) == (True, None)
        places.heard(f"slow-{n}")


def test_when_every_place_is_taken_the_oldest_unfinished_request_goes() -> None:
    places: Places[str] = Places(4, 4, 4)
    full(places, [f"10.0.{n}.1" for n in range(4)])  # four networks, one each
    places.whole("slow-0")  # its request arrived whole: its answer is being worked out
    assert places.admit("prompt", "10.9.0.1") == (True, "slow-1")
    assert len(places) == 4 and "slow-1" not in places.holders()


def test_over_its_networks_share_a_newcomer_takes_that_networks_slowest() -> None:
    places: Places[str] = Places(64, 16, 4)
    full(places, [f"10.0.0.{n}" for n in range(2, 6)] + ["10.0.1.2"])
    assert places.admit("scraper", "10.0.0.1") == (True, "slow-0")
    places.new_turn()
    for n in range(1, 4):  # whole requests are never taken for a slow one
        places.whole(f"slow-{n}")
    places.whole("scraper")
    assert places.admit("late", "10.0.0.9") == (False, None)  # none slow in its network


def test_over_its_peers_share_a_newcomer_takes_that_peers_slowest() -> None:
    places: Places[str] = Places(64, 2, 32)
    full(places, ["10.0.0.2", "10.0.0.3", "10.0.0.2"])
    assert places.admit("again", "10.0.0.2") == (True, "slow-0")  # not slow-1: other peer


def test_a_newcomer_not_read_yet_keeps_its_place_until_it_had_a_turn() -> None:
    places: Places[str] = Places(2, 2, 2)
    assert places.admit("a", "10.0.0.1") == (True, None)  # a burst of newcomers, in
    assert places.admit("b", "10.0.1.1") == (True, None)  # one turn, nothing read yet
    assert places.admit("c", "10.0.2.1") == (False, None)
    places.new_turn()  # the turn that reads what they sent
    assert places.admit("c", "10.0.2.1") == (False, None)
    places.heard("b")  # half a request: slow from now on
    assert places.admit("c", "10.0.2.1") == (True, "b")
    places.new_turn()  # a has had a whole turn and sent nothing: slow too
    assert places.admit("d", "10.0.3.1") == (True, "a")
    places.whole("c")  # c's request came whole: never taken for being slow
    places.new_turn()
    places.new_turn()
    assert places.admit("e", "10.0.4.1") == (True, "d")
    assert places.admit("f", "10.0.5.1") == (False, None)  # c whole, e not read yet


def test_the_network_holding_the_most_pays_first() -> None:
    places: Places[str] = Places(4, 4, 4)
    full(places, ["10.0.0.1", "10.0.1.1", "10.0.1.2", "10.0.1.3"])
    assert places.admit("newcomer", "10.0.2.1") == (True, "slow-1")  # not the oldest, slow-0


def test_with_no_slow_holder_a_much_larger_network_still_gives_way() -> None:
    places: Places[str] = Places(4, 4, 4)
    full(places, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1"])
    for n in range(4):
        places.whole(f"slow-{n}")  # e.g. slow readers of their answers
    assert places.admit("newcomer", "10.0.2.1") == (True, "slow-0")
    places.new_turn()
    places.whole("newcomer")
    assert places.admit("another", "10.0.3.1") == (True, "slow-1")  # 2 places against 0
    places.new_turn()
    places.whole("another")
    assert places.admit("third", "10.0.4.1") == (False, None)  # one place each: balanced


def test_a_forgotten_holder_frees_its_place_in_every_count() -> None:
    places: Places[str] = Places(2, 1, 2)
    full(places, ["10.0.0.1", "10.0.0.2"])
    places.forget("slow-0")
    places.forget("slow-0")  # idempotent
    assert places.admit("back", "10.0.0.1") == (True, None)
    assert len(places) == 2
