"""A lease newly tracked waits in the keeper's nursery, not its heap: one forgotten before
its first renewal (a settled delivery) leaves no heap entry, and one still held when its
renewal comes is renewed on time, with the heap's leases in the same round.

(The keeper's other rules, against a real rsd, are in test_lease_renewal.py.)
"""

from __future__ import annotations

import asyncio

from test_lease_renewal import FakeConnection, handle, lease

from rsclient.keeper import LeaseKeeper


async def test_leases_forgotten_before_their_renewal_never_enter_the_heap() -> None:
    keeper = LeaseKeeper(FakeConnection())  # type: ignore[arg-type]
    for i in range(1, 5001):
        keeper.forget(lease(keeper, i))
    assert len(keeper) == 0
    assert not keeper._heap and not keeper._armed and not keeper._young
    keeper.close()


async def test_a_lease_kept_in_the_nursery_is_renewed_at_its_time() -> None:
    conn = FakeConnection()
    keeper = LeaseKeeper(conn)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    started = loop.time()
    short = lease(keeper, 1, seconds=0.3)  # renewed at 0.1 s
    for i in range(2, 50):
        keeper.forget(lease(keeper, i, seconds=0.3))  # settled at once
    while not conn.requests and loop.time() < started + 2:
        await asyncio.sleep(0.005)
    assert conn.requests == [[handle(1)]], conn.requests
    assert started + 0.1 - 0.002 <= loop.time() < started + 0.2  # at a third, not later
    await asyncio.sleep(0.01)
    assert not short.is_lost and short.renew_at > started + 0.1  # confirmed and moved on
    assert len(keeper._young) == 0 and len(keeper._armed) == 1  # now in the heap
    keeper.close()


async def test_a_nursery_lease_and_a_heap_lease_due_together_share_a_round() -> None:
    conn = FakeConnection()
    keeper = LeaseKeeper(conn)  # type: ignore[arg-type]
    old = lease(keeper, 1, seconds=0.6)  # renewed at 0.2 s
    keeper._due()  # moves it to the heap (nothing due yet)
    assert len(keeper._armed) == 1 and not keeper._young and not conn.requests
    young = lease(keeper, 2, seconds=0.6)  # due a moment later, within a sixth of 0.6 s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2
    while not conn.requests and loop.time() < deadline:
        await asyncio.sleep(0.005)
    assert conn.requests == [[handle(1), handle(2)]]
    assert not old.is_lost and not young.is_lost
    keeper.close()


async def test_tracking_a_heap_lease_again_keeps_one_live_entry() -> None:
    keeper = LeaseKeeper(FakeConnection())  # type: ignore[arg-type]
    held = lease(keeper, 1)
    keeper._due()
    keeper.track(held)  # twice: not in the nursery as well
    assert not keeper._young and len(keeper._armed) == 1
    keeper.forget(held)
    assert not keeper._armed and len(keeper) == 0
    keeper.close()
