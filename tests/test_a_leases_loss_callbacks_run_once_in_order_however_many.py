"""A lease's loss callbacks: each one given runs once at the loss, in the order given,
and one forgotten does not run, whether the lease holds one (kept without a list: a
delivery's, its runner's, issue 33) or several (a list from the second on)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from support.aio import now
from support.keeper import keeper_on_no_server

from rsclient.errors import LeaseLostError
from rsclient.keeper import LeaseKeeper
from rsclient.leases import Lease, declare_lost, hold_here, unhold, unhold_here

_ids = (n.to_bytes(8, "big") + bytes(8) for n in itertools.count(1))



def _lease(keeper: LeaseKeeper) -> Lease:
    return Lease(keeper, next(_ids), scope="s", key="k", generation=1, lease_seconds=30,
                 confirmed_at=now())


class _Event:
    """``event.set``: a fresh bound method at each read, equal but not identical."""

    def __init__(self, called: list[str], name: str) -> None:
        self.called, self.name = called, name

    def set(self) -> None:
        self.called.append(self.name)


@pytest.mark.parametrize("given", [1, 2, 3])
async def test_a_leases_loss_callbacks_run_once_in_order_however_many(given: int) -> None:
    keeper = keeper_on_no_server()
    called: list[str] = []
    callbacks: list[Callable[[], None]] = [
        _Event(called, str(n)).set for n in range(given)]
    # forgotten ones, given before, between and after: none of them runs
    gone = [_Event(called, "forgotten") for _ in range(3)]
    forgotten: list[Callable[[], None]] = [event.set for event in gone]
    lease = _lease(keeper)
    lease.add_loss_callback(forgotten[0])
    for n, callback in enumerate(callbacks):
        if n % 2:
            lease.add_loss_callback(callback)
        else:
            hold_here(lease, callback)
        if n == 0:
            lease.add_loss_callback(forgotten[1])
    hold_here(lease, forgotten[2])
    lease.remove_loss_callback(gone[0].set)  # an equal one forgets it
    unhold(lease, forgotten[1])
    unhold(lease, forgotten[2])
    declare_lost(lease, "test")
    assert called == [str(n) for n in range(given)]
    declare_lost(lease, "again")  # once
    assert called == [str(n) for n in range(given)]
    keeper.close()


async def test_a_runners_end_forgets_its_callback_and_says_whether_the_lease_is_lost() -> None:
    keeper = keeper_on_no_server()
    called: list[str] = []
    held = _lease(keeper)
    hold_here(held, _Event(called, "one").set)
    callback = _Event(called, "mine").set
    hold_here(held, callback)
    unhold_here(held, callback)  # held: no error
    lost = _lease(keeper)
    mine = _Event(called, "lost").set
    hold_here(lost, mine)
    declare_lost(lost, "test")
    with pytest.raises(LeaseLostError):
        unhold_here(lost, mine)
    declare_lost(held, "test")
    assert called == ["lost", "one"]
    keeper.close()
