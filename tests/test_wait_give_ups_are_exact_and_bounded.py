"""A parked wait's own limit (``GiveUpLines``, rsclient/retry.py) gives a future up at
exactly its moment, without a timer handle per wait, and keeps nothing once answered.

Futures of one delay share one line and one timer; each is still cancelled at its own
moment (not at the first one's, not a bucket later); an answered future leaves at once,
and a line that empties is dropped with its timer, so waits of ever new lengths do not
pile up lines.
"""

from __future__ import annotations

import asyncio
import contextlib

from rsclient.retry import GiveUpLines


async def _given_up(fut: asyncio.Future[None], within: float) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(fut), within)


async def test_each_future_of_a_line_is_given_up_at_its_own_moment() -> None:
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    first: asyncio.Future[None] = loop.create_future()
    second: asyncio.Future[None] = loop.create_future()
    first_at = loop.time() + 0.1
    lines.watch(first, 0.1)
    await asyncio.sleep(0.06)
    second_at = loop.time() + 0.1
    lines.watch(second, 0.1)
    assert len(lines._lines) == 1  # one line, one timer, for both
    await _given_up(first, 1.0)
    assert first.cancelled() and loop.time() >= first_at - 0.002  # (uvloop: ms clock)
    assert not second.done(), "the second was given up at the first one's moment"
    await _given_up(second, 1.0)
    assert second.cancelled() and loop.time() >= second_at - 0.002
    assert loop.time() < second_at + 0.1, "given up late"
    assert len(lines) == 0 and not lines._lines


async def test_an_answered_future_is_never_given_up_and_leaves_at_once() -> None:
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    answered: asyncio.Future[int] = loop.create_future()
    waiting: asyncio.Future[int] = loop.create_future()
    line = lines.watch(answered, 0.05)
    lines.watch(waiting, 0.05)
    answered.set_result(1)
    line.unwatch(answered)
    assert len(lines) == 1
    await _given_up(waiting, 1.0)  # type: ignore[arg-type]
    assert waiting.cancelled()
    assert answered.result() == 1
    assert len(lines) == 0 and not lines._lines


async def test_waits_of_ever_new_lengths_keep_no_line_once_answered() -> None:
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    timers_before = len(getattr(loop, "_scheduled", ()))
    for n in range(2000):
        fut: asyncio.Future[None] = loop.create_future()
        line = lines.watch(fut, 30.0 + n / 1000)
        fut.set_result(None)
        line.unwatch(fut)
    assert not lines._lines and len(lines) == 0
    await asyncio.sleep(0)
    # (asyncio's own loop lists its timers: the cancelled ones are not piling up there)
    assert len(getattr(loop, "_scheduled", ())) <= timers_before + 1


async def test_a_line_that_empties_on_its_moment_is_dropped() -> None:
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    futs: list[asyncio.Future[None]] = [loop.create_future() for _ in range(50)]
    for fut in futs:
        lines.watch(fut, 0.02)
    await asyncio.gather(*(_given_up(fut, 1.0) for fut in futs))
    assert all(fut.cancelled() for fut in futs)
    assert not lines._lines


async def test_a_mass_given_up_at_one_moment_goes_in_one_pass_answered_ones_skipped() -> None:
    """20,000 futures of one delay, every other one answered out of order first: the
    rest are all given up when their moment comes, and nothing is kept after. (The line
    is an OrderedDict so that this pass is linear: a plain dict rescans the dead slots
    of the keys it deleted for every next first key, quadratic in the mass.)"""
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    futs: list[asyncio.Future[None]] = [loop.create_future() for _ in range(20_000)]
    line = None
    for fut in futs:
        line = lines.watch(fut, 0.05)
    assert line is not None
    for fut in reversed(futs[::2]):
        fut.set_result(None)
        line.unwatch(fut)
    await _given_up(futs[-1], 1.0)
    assert [fut.cancelled() for fut in futs] == [i % 2 == 1 for i in range(len(futs))]
    assert len(lines) == 0 and not lines._lines


async def test_a_line_tells_when_a_watched_future_was_watched() -> None:
    """``sent_at``: the moment a future was watched from (a wait's send time, which
    ``Ticket.result`` reads from here only when the wait failed), while it is watched."""
    loop = asyncio.get_running_loop()
    lines = GiveUpLines()
    fut: asyncio.Future[None] = loop.create_future()
    watched_at = loop.time()
    line = lines.watch(fut, 30.0)
    await asyncio.sleep(0.05)
    assert watched_at - 1e-9 <= line.sent_at(fut) < watched_at + 0.001  # (not now)
    line.unwatch(fut)
    assert line.sent_at(fut) >= watched_at + 0.04  # no longer watched: the time now
