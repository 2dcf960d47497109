"""Every stall of rsd's event loop over 100 ms is logged with its length and counted.

A stall longer than a lease costs every client its leases, so an operator must see each
one: SERVER_STATS reports ``loop.stalls`` and ``loop.longest_stall_ms``, and the log has
a line per stall. The watchdog is one repeating timer measuring its own lateness; the
same timer closes connections whose unfinished frame is overdue, looking only at those.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.process import Rsd

from rsd.policy import Policy
from rsd.watchdog import Watchdog
from rsproto import Op


async def test_a_stalled_server_reports_the_stall(rsd: Rsd, raw_connect: Any) -> None:
    raw = await raw_connect(rsd.address)
    await raw.hello()
    quiet = (await raw.ok(Op.SERVER_STATS, {}))["loop"]
    rsd.pause()  # the whole process stops: its loop's next tick comes late
    await asyncio.sleep(0.4)
    rsd.resume()
    # The request may be read before the watchdog's late tick runs: ask until it has.
    for _ in range(100):
        stats = (await raw.ok(Op.SERVER_STATS, {}))["loop"]
        if stats["stalls"] > quiet["stalls"]:
            break
        await asyncio.sleep(0.01)
    assert stats["stalls"] >= quiet["stalls"] + 1  # (a busy test machine may add more)
    assert 300 <= stats["longest_stall_ms"] < 2000
    assert "event loop stalled for" in rsd.log()


class Handle:
    def cancel(self) -> None:
        pass


class FakeLoop:
    """Just what the watchdog asks of a loop: the time, and a timer it never fires."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Handle:
        return Handle()


def test_overdue_frames_expire_by_their_first_byte_in_order() -> None:
    loop = FakeLoop()
    expired: list[str] = []
    dog: Watchdog[str] = Watchdog(loop, 10.0, expired.append)  # type: ignore[arg-type]
    dog.start()
    dog.frame_pending("a", 0.0)
    dog.frame_pending("b", 1.0)
    dog.frame_pending("a", 5.0)  # still the same frame: its clock keeps running
    dog.frame_begun("b", 6.0)  # b finished a frame and began another: a new clock
    dog.frame_pending("c", 2.0)
    dog.frame_done("c")  # c finished
    loop.now = 10.5
    dog._tick()
    assert expired == ["a"]
    loop.now = 15.9
    dog._tick()
    assert expired == ["a"]
    loop.now = 16.0
    dog._tick()
    assert expired == ["a", "b"]
    assert dog.stats()["unfinished_frames"] == 0


def test_the_watchdog_counts_a_tick_late_by_the_stall_bound_and_nothing_less() -> None:
    """Its own lateness, on a clock the test moves (on the real loop a loaded test machine
    stalled the test's own process past the bound: the stalled server above shows the
    real loop's)."""
    loop = FakeLoop()
    dog: Watchdog[object] = Watchdog(loop, 30.0, lambda conn: None,  # type: ignore[arg-type]
                                     interval=0.01)
    dog.start()
    loop.now = 0.01  # on time
    dog._tick()
    loop.now += 0.01 + Policy.STALL_SECONDS - 0.001  # late, by just under the bound
    dog._tick()
    assert (dog.stalls, dog.longest_stall) == (0, 0.0)
    loop.now += 0.01 + Policy.STALL_SECONDS + 0.1  # a callback that blocked the loop
    dog._tick()
    assert dog.stalls == 1
    assert dog.longest_stall >= Policy.STALL_SECONDS + 0.1 - 1e-9
    loop.now += 0.01  # on time again
    dog._tick()
    assert dog.stalls == 1
