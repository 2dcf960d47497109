"""An unanswered release is given up at its lease's deadline, on one shared timer.

``GiveUps`` (rsclient/retry.py) replaces a timer per release: a watched future is
cancelled no sooner than its moment and at most one bucket later; an answered one is
forgotten at once (nothing kept per release); one loop timer serves all of them.
"""

from __future__ import annotations

import asyncio
import contextlib

from rsclient.retry import GiveUps


async def test_a_watched_future_is_given_up_in_its_bucket_not_before() -> None:
    loop = asyncio.get_running_loop()
    give_ups = GiveUps()
    fut: asyncio.Future[None] = loop.create_future()
    at = loop.time() + 0.1
    give_ups.watch(fut, at)
    await asyncio.sleep(0.05)
    assert not fut.done()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(fut), GiveUps.GRAIN + 0.5)
    assert fut.cancelled() and loop.time() >= at
    assert len(give_ups) == 0


async def test_answered_futures_leave_nothing_and_share_one_timer() -> None:
    loop = asyncio.get_running_loop()
    give_ups = GiveUps()
    futs = [loop.create_future() for _ in range(1000)]
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    slots = [give_ups.watch(fut, loop.time() + 30 + n / 100) for n, fut in enumerate(futs)]
    assert len(loop._scheduled) - before == 1  # type: ignore[attr-defined]
    for fut, slot in zip(futs, slots, strict=True):
        fut.set_result(None)
        give_ups.unwatch(fut, slot)
    assert len(give_ups) == 0 and give_ups._buckets == {}


async def test_an_earlier_moment_moves_the_one_timer_forward() -> None:
    loop = asyncio.get_running_loop()
    give_ups = GiveUps()
    late: asyncio.Future[None] = loop.create_future()
    early: asyncio.Future[None] = loop.create_future()
    give_ups.watch(late, loop.time() + 60)
    give_ups.watch(early, loop.time() + 0.01)
    await asyncio.sleep(GiveUps.GRAIN + 0.1)
    assert early.cancelled() and not late.done()
    late.cancel()
