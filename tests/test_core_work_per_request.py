"""Every request costs O(1) or O(its own size), amortised, whatever the server holds.

Attacks from issue 8: 1,000 SERVER_STATS stalled rsd 36.7 s (each walked every timer
bucket); cancelling 65,536 parked receives newest-first took 21.9 s (a linear search per
withdrawal). Here, on the pure core: stats never walk a table (a table that refuses to
be walked is put in place), and cancelling waits in any order leaves every line at most
twice its pending waits plus a constant at every step, and empty at the end, which is
what makes each withdrawal O(1) amortised. Nothing here measures time.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, next_rid

from rsd.core import DEFERRED
from rsd.core.ground.waits import WaitLine
from rsd.policy import Policy
from rsproto import Limits, Op

PARKED = Policy.MAX_WAITS_PER_CONNECTION  # 65,536: as many as one connection may park


class NoWalk(dict):  # type: ignore[type-arg]
    """A dict whose entries may be looked up, added and removed, but never walked."""

    def _walked(self, *args: Any) -> Any:
        raise AssertionError("a table was walked")

    __iter__ = values = items = keys = _walked  # type: ignore[assignment]


def bounded(line: WaitLine) -> bool:
    """A line never holds more than twice its pending waits, plus a constant."""
    return len(line._line) <= 2 * len(line) + 33


def park(core: CoreDriver, op: int, args: dict[str, Any], count: int, conn: int = BOB) -> list[int]:
    rids = []
    for _ in range(count):
        rid = next_rid()
        assert core.handle(0.0, conn, rid, op, args) is DEFERRED
        rids.append(rid)
    return rids


def cancel_all(core: CoreDriver, rids: list[int], line: Any, conn: int = BOB) -> None:
    """Cancel every wait, checking the line's bound as it shrinks."""
    for n, rid in enumerate(rids):
        assert core.handle(0.0, conn, next_rid(), Op.CANCEL, {"request": rid}) == {
            "cancelled": True
        }
        if n % 512 == 0:
            assert bounded(line())


@pytest.mark.at_scale
@pytest.mark.parametrize("order", ["newest first", "oldest first"])
def test_cancelling_65536_parked_receives_in_any_order_is_linear_and_leaves_nothing(
    order: str,
) -> None:
    core = CoreDriver(recovered=True)
    baseline = core.stats()
    rids = park(core, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}, PARKED)
    queue = core.scopes[("default", "s")].queues["jobs"]
    assert core.stats()["waits"] == PARKED and len(queue.consumers) == PARKED
    cancel_all(core, rids[::-1] if order == "newest first" else rids, lambda: queue.consumers)
    assert len(queue.consumers._line) == 0
    core.drain()
    assert core.stats() == baseline  # no wait, timer, queue or scope left behind


@pytest.mark.parametrize("order", ["newest first", "oldest first", "every other"])
def test_cancelling_claim_waiters_in_any_order_keeps_the_line_bounded(order: str) -> None:
    core = CoreDriver(recovered=True)
    core.handle(0.0, ALICE, next_rid(), Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    baseline = core.stats()
    count = Limits.MAX_WAITERS_PER_KEY
    rids = park(core, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True}, count)
    claim = core.scopes[("default", "s")].claims["k"]
    ordered = {
        "newest first": rids[::-1],
        "oldest first": rids,
        "every other": rids[::2] + rids[1::2],
    }[order]
    cancel_all(core, ordered, lambda: claim.waiters or WaitLine())
    assert claim.waiters == ()  # the empty line is let go
    core.drain()
    assert core.stats() == baseline


def test_cancelling_result_waits_newest_first_keeps_the_watchers_bounded() -> None:
    core = CoreDriver(recovered=True)
    task = core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1})["id"]
    baseline = core.stats()
    rids = park(core, Op.TASK_RESULT, {"scope": "s", "task": task}, 20_000)
    item = core.work.items[task]
    cancel_all(core, rids[::-1], lambda: item.watchers or WaitLine())
    assert item.watchers == ()
    core.drain()
    assert core.stats() == baseline


def test_a_served_line_skips_what_was_withdrawn_and_keeps_its_order() -> None:
    """Withdrawn waits are skipped, not served; the others are served first come first."""
    core = CoreDriver(recovered=True)
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})["lease"]
    rids = park(core, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True}, 100)
    for rid in rids[:40] + rids[50:90]:
        core.handle(0.0, BOB, next_rid(), Op.CANCEL, {"request": rid})
    core.drain()
    granted = []
    for _ in range(20):
        core.call(Op.CLAIM_RELEASE, {"lease": lease})
        [(_, message)] = [m for m in core.drain() if m[1][0] == 2]  # the deferred grant
        granted.append(message[1])
        lease = message[2]["lease"]
    assert granted == rids[40:50] + rids[90:]


@pytest.mark.at_scale
def test_stats_never_walk_a_table() -> None:
    """With 100,000 timers, waits and leases in place, stats only reads counters."""
    core = CoreDriver(recovered=True)
    for n in range(50_000):
        core.handle(0.0, ALICE, next_rid(), Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{n}"})
    park(core, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}, 50_000)
    expected = core.stats()
    quiet_runs = len(core.run_ends.line)  # run "s" held nothing before (runends.py)
    assert expected["timers"] - quiet_runs == 100_000 and expected["waits"] == 50_000
    core.wheel._buckets = NoWalk(core.wheel._buckets)
    core.waits._by_conn = NoWalk(core.waits._by_conn)
    scopes = core.scopes
    for scope in scopes.values():
        scope.claims = NoWalk(scope.claims)
        scope.queues = NoWalk(scope.queues)
    core.tables.scopes = core.scopes = NoWalk(scopes)
    core.leases.live = NoWalk(core.leases.live)
    for _ in range(1000):
        assert core.stats() == expected


def test_renewals_do_no_wheel_work() -> None:
    """A renewal (the hot path) touches only its lease: the wheel is not changed."""
    core = CoreDriver(recovered=True)
    leases = [
        core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{n}"})["lease"] for n in range(100)
    ]
    buckets = {slot: dict(bucket) for slot, bucket in core.wheel._buckets.items()}
    heap = list(core.wheel._heap)
    for second in range(1, 20):
        assert core.call(Op.LEASE_RENEW, {"leases": leases}, now=float(second)) == {
            "results": [None] * 100
        }
    assert {slot: dict(b) for slot, b in core.wheel._buckets.items()} == buckets
    assert core.wheel._heap == heap
