"""A long line of blocked items is worked through one step per loop turn, never all at once.

Found by an adversarial client: 100,000 tasks needing an exhausted quota. The steps of
MAX_BLOCKED_PER_STEP items were chained by timers due at once, and ``Core.tick`` pops what
is due again until its own budget is spent, so one tick blocked 87,000 items (0.7 s) and
the refill's wake moved all 100,000 back (1.6 s). On the pure core: every ``Core.tick``
call moves at most one step of items on or off the quota's line, and the next step is
due strictly later (the next wheel tick), yet every item is still reached.
"""

from __future__ import annotations

from support.core import BOB, CoreDriver, next_rid

from rsd.core import DEFERRED
from rsd.policy import Policy
from rsproto import Op

STEP = Policy.MAX_BLOCKED_PER_STEP
ITEMS = 6 * STEP + 11


def line_length(core: CoreDriver) -> int:
    quota = core.quotas.quotas[("default", "q")]
    line = core.blocked.lines.get(quota)
    return 0 if line is None else len(line.items) - line.stale


def test_blocking_and_the_refill_wake_move_one_step_per_tick() -> None:
    core = CoreDriver(recovered=True)
    core.call(Op.QUOTA_ENSURE, {"name": "q", "limit": 1, "per_seconds": 5})
    core.call(Op.QUOTA_TAKE, {"scope": "s", "quota": "q", "amount": 1})  # now exhausted
    for start in range(0, ITEMS, 256):
        items = [{"key": f"k{i}", "data": None, "needs": {"quotas": {"q": 1}}}
                 for i in range(start, min(ITEMS, start + 256))]
        core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": items})
    wait = {"scope": "s", "mailbox": "jobs", "wait": True, "timeout_ms": 600_000}
    assert core.handle(core.now, BOB, next_rid(), Op.RECEIVE, wait) is DEFERRED
    assert line_length(core) == STEP  # the receive paid for one step
    moves = []
    seen_full = False
    while (deadline := core.next_deadline()) is not None and core.now < 60:
        before = line_length(core)
        core.tick(core.now)  # what is due at this same instant: nothing more
        assert line_length(core) == before
        core.now = max(core.now, deadline)
        core.tick(core.now)
        moves.append(abs(line_length(core) - before))
        seen_full = seen_full or line_length(core) >= ITEMS - 1
        core.drain()
        if seen_full and line_length(core) == 0:
            break
    assert seen_full, "every item was reached and blocked"
    assert line_length(core) == 0, "the refill's wake moved every item back"
    assert max(moves) <= STEP
    status = core.call(Op.SCOPE_STATUS, {"scope": "s"})
    assert status["tasks"] == {"PENDING": ITEMS - 1, "RUNNING": 1}  # one got the refill
