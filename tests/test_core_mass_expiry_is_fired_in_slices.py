"""A mass of deadlines at one instant is fired a bounded slice per tick, losing nothing.

``Core.tick`` fires at most ``Policy.MAX_FIRED_PER_TICK`` entries; the rest stays due
on the wheel, in order (``next_deadline()`` is not after ``now``), and the shell ticks
again at the next loop turn. So 100,000 leases expiring at once cost each loop turn a
slice, and a bystander is answered in between. Checked on the fake clock: every lease is
expired exactly once, in deadline order and in grant order within one instant; a lease
released between two slices is not expired; the waiters behind each key are granted.
"""

from __future__ import annotations

from support.core import BOB, CoreDriver

from rsd.core.ground.timerwheel import TimerWheel
from rsd.core.records import Rec
from rsd.policy import Policy
from rsproto import Op

SLICE = Policy.MAX_FIRED_PER_TICK


def expired(records: list[tuple[object, ...]]) -> list[int]:
    return [rec[1] for rec in records if rec[0] == Rec.LEASE_ENDED and rec[2] == "expired"]


def test_a_mass_expiry_is_fired_in_slices_in_order_and_loses_nothing() -> None:
    core = CoreDriver()
    scope = core.call(Op.SCOPE_CREATE, {})["scope"]
    count = 3 * SLICE + 100
    first = [
        core.call(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{i}", "lease_seconds": 5})
        for i in range(count)
    ]
    for i in range(0, count, 100):  # a waiter behind some keys
        core.call(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{i}", "lease_seconds": 30,
                                     "wait": True, "timeout_ms": 60_000}, conn=BOB)
    core.now = 1.0
    later = [
        core.call(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"late{i}", "lease_seconds": 5})
        for i in range(10)
    ]
    core.drain()
    core.now = 10.0  # every one of them is past its deadline
    fired: list[int] = []
    ticks = 0
    released: list[int] = []
    while (deadline := core.next_deadline()) is not None and deadline <= core.now:
        core.tick(core.now)
        ticks += 1
        before = len(core.records)
        core.drain()
        now_fired = expired(core.records[before:])
        assert len(now_fired) <= SLICE, "a tick fired more than its slice"
        fired += now_fired
        if ticks == 1:  # released between two slices: never expired
            for grant in first[-5:]:
                core.call(Op.CLAIM_RELEASE, {"lease": grant["lease"]})
                released.append(grant["lease"])
    expected = [g["lease"] for g in first if g["lease"] not in released]
    expected += [g["lease"] for g in later]
    assert fired == expected, "a lease was lost, fired twice or out of order"
    assert ticks >= count // SLICE
    held = core.stats()["leases"]
    assert held == len(range(0, count, 100)), (
        "every waiter is granted its key when the lease before it expired"
    )
    assert core.next_deadline() is not None and core.next_deadline() > core.now


def test_the_wheel_hands_back_a_partly_taken_slot_in_order() -> None:
    wheel = TimerWheel()
    for i in range(10):
        wheel.schedule(1.0, f"a{i}")
    wheel.schedule(1.0, "a3")  # scheduled twice: comes back twice
    wheel.schedule(2.0, "b")
    assert wheel.pop_due(5.0, 4) == ["a0", "a1", "a2", "a3"]
    assert wheel.next_deadline() == 1.0
    assert wheel.cancel(1.0, "a5")
    assert wheel.pop_due(5.0, 1) == ["a3"]  # the second entry of a3
    assert wheel.pop_due(5.0, 100) == ["a4", "a6", "a7", "a8", "a9", "b"]
    assert len(wheel) == 0 and wheel.next_deadline() is None


def test_an_unbounded_pop_still_takes_everything_due() -> None:
    wheel = TimerWheel()
    for i in range(3 * SLICE):
        wheel.schedule(1.0 + i * 0.001, i)
    assert wheel.pop_due(10.0) == list(range(3 * SLICE))
