"""A lease is believed only until its own deadline, read from the clock when asked.

The deadline is the send time of the last request whose reply confirmed the lease, plus
the lease, minus a safety margin of max(1 s, 10 %). ``is_lost``, ``raise_if_lost()`` and
``lost_event`` look at the clock themselves: an event loop blocked past the lease runs no
timer until it is unblocked, and the code that blocked it must learn of the loss at its
very next look, not after a timer callback (issue 8, item 7).

The arithmetic first, on leases made with a confirmation time in the past (no server,
no waiting); then once against a real rsd, where another client is granted the key while
the holder's loop is blocked.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.aio import now
from support.keeper import keeper_on_no_server
from support.process import SHORT_LEASE, SHORT_LEASES

from rsclient import AsyncRunstate, LeaseLostError
from rsclient.keeper import LeaseKeeper
from rsclient.leases import Lease, confirm_renewal, loss_margin

MakeClient = Callable[..., AsyncRunstate]
_ids = (n.to_bytes(8, "big") + bytes(8) for n in itertools.count(1))  # lease handles


def _lease(keeper: LeaseKeeper, confirmed_ago: float, seconds: float = 5.0) -> Lease:
    """A tracked lease whose last confirmation was sent ``confirmed_ago`` seconds ago."""
    lease = Lease(keeper, next(_ids), scope="s", key="k", generation=1, lease_seconds=seconds,
                  confirmed_at=now() - confirmed_ago)
    keeper.track(lease)
    return lease


def test_the_margin_is_a_second_or_a_tenth_of_the_lease() -> None:
    assert loss_margin(5) == 1.0
    assert loss_margin(10) == 1.0
    assert loss_margin(30) == 3.0
    assert loss_margin(600) == 60.0


async def test_the_deadline_is_send_time_plus_lease_minus_margin() -> None:
    keeper = keeper_on_no_server()
    lease = _lease(keeper, 0.0, seconds=30)
    confirm_renewal(lease, 100.0)
    assert lease.lost_at == 100.0 + 30 - 3
    assert lease.renew_at == 100.0 + 10
    keeper.close()


async def test_a_lease_past_its_deadline_is_lost_when_asked_without_any_timer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Confirmed 3.9 s ago, a 5 s lease has 0.1 s left (deadline at 4 s). The loop is
    then blocked for 0.15 s: the first look after it says lost, logs the loss, sets the
    event, runs the callbacks and stops the renewals, with no loop turn in between."""
    caplog.set_level(logging.WARNING, logger="rsclient")
    keeper = keeper_on_no_server()
    lease = _lease(keeper, 3.9)
    assert not lease.is_lost
    event = lease.lost_event
    called: list[str] = []
    lease.add_loss_callback(lambda: called.append("stop"))
    time.sleep(0.15)  # the loop is blocked: no timer can run
    assert lease.lost_reason is None  # nothing has declared it yet
    assert lease.is_lost
    assert event.is_set()
    assert called == ["stop"]
    with pytest.raises(LeaseLostError, match="safety margin"):
        lease.raise_if_lost()
    assert len(keeper) == 0, "a lost lease is still renewed"
    assert any("lost" in r.getMessage() for r in caplog.records), "the loss was not logged"
    keeper.close()


async def test_each_look_reads_the_clock() -> None:
    """``raise_if_lost()`` and ``lost_event`` are looks of their own, like ``is_lost``."""
    keeper = keeper_on_no_server()
    first = _lease(keeper, 4.05)
    with pytest.raises(LeaseLostError):
        first.raise_if_lost()
    second = _lease(keeper, 4.05)
    assert second.lost_event.is_set()
    keeper.close()


async def test_lost_event_is_set_at_the_deadline_by_a_timer_of_its_own() -> None:
    """Nothing renews a received delivery: its event is still set at the deadline."""
    keeper = keeper_on_no_server()
    lease = Lease(keeper, next(_ids), scope="s", key="d", generation=1, lease_seconds=5,
                  confirmed_at=now() - 3.8)  # deadline in 0.2 s
    keeper.know(lease)
    await asyncio.wait_for(lease.lost_event.wait(), 2)
    assert lease.lost_reason is not None


async def test_a_worker_thread_sees_the_deadline_and_the_loop_declares_it() -> None:
    """``run()`` runs a plain function in a thread: its look at ``is_lost`` reads the same
    clock, and the loss is declared on the loop's thread."""
    keeper = keeper_on_no_server()
    lease = _lease(keeper, 4.05)
    seen = await asyncio.to_thread(lambda: lease.is_lost)
    assert seen
    await asyncio.sleep(0)  # the declaration handed to the loop
    await asyncio.sleep(0)
    assert lease.lost_reason is not None
    assert lease.lost_event.is_set()
    keeper.close()


async def test_a_loop_blocked_past_the_lease_knows_it_lost_the_lease_at_once(
    clients: MakeClient, rsd_factory: Callable[..., Any]
) -> None:
    """The holder's loop is blocked (``time.sleep`` inside the function ``run()`` runs)
    until another client, on a thread of its own, has been granted the key by the
    server's expiry of the lease (``SHORT_LEASE``, nothing renews it). At the first look
    after the block, before any timer could run, the lease is lost and
    ``raise_if_lost()`` raises; ``run()`` then raises LeaseLostError as documented."""
    rsd = rsd_factory(*SHORT_LEASES)
    rs = clients("holder", rsd.address)
    run = await rs.scopes.create()
    granted = threading.Event()
    release_bystander = threading.Event()
    problems: list[BaseException] = []

    def bystander() -> None:
        async def main() -> None:
            async with AsyncRunstate(holder="next-owner", address=rsd.address) as other:
                lease = await other.scope(run.id).claim("k", lease_seconds=5).acquire(
                    wait=True, timeout_ms=15_000
                )
                granted.set()
                await asyncio.get_running_loop().run_in_executor(
                    None, release_bystander.wait, 15
                )
                await lease.release()

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the test below
            problems.append(exc)
            granted.set()

    seen: dict[str, Any] = {}

    async def work(lease: Lease) -> None:
        thread.start()
        blocked_at = time.monotonic()
        assert granted.wait(10), "the next owner was never granted the key"  # loop blocked
        seen["blocked"] = time.monotonic() - blocked_at
        seen["timer_declared"] = lease.lost_reason is not None  # nothing ran meanwhile
        seen["is_lost"] = lease.is_lost
        try:
            lease.raise_if_lost()
        except LeaseLostError:
            seen["raised"] = True
            raise
        seen["raised"] = False

    thread = threading.Thread(target=bystander, daemon=True)
    try:
        with pytest.raises(LeaseLostError):
            await run.claim("k", lease_seconds=SHORT_LEASE).run(work)
    finally:
        release_bystander.set()
        await asyncio.to_thread(thread.join, 15)
    assert not problems, problems
    # The server ended the lease: the key changed hands.
    assert seen["blocked"] > 0.8 * SHORT_LEASE, seen
    assert not seen["timer_declared"], "a timer ran inside a blocked loop?"
    assert seen["is_lost"], "is_lost still said held after the next owner was granted"
    assert seen["raised"], "raise_if_lost() passed after the next owner was granted"
