"""Every parked request is answered exactly once, whatever ends its wait.

A wait (CLAIM_ACQUIRE, RECEIVE or TASK_RESULT with ``wait``) can end by being served, by
its timeout, by CANCEL, or by its scope being cancelled; each gets one answer, and no
later event answers it again. Driven on the pure core with a fake clock.
"""

from __future__ import annotations

from support.core import BOB, CoreDriver, call, next_rid

from rsd.core import DEFERRED
from rsproto import Kind, Op


def test_every_wait_is_answered_once_whatever_ends_it() -> None:
    """Served, timed out, cancelled, scope-cancelled: one answer each, none twice."""
    core = CoreDriver(recovered=True)
    held = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    task = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1})
    call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})  # takes the task
    rids = {}
    for name, op, args in [
        ("acquire", Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True,
                                       "timeout_ms": 2000}),
        ("acquire2", Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True}),
        ("receive", Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True,
                                 "timeout_ms": 1000}),
        ("receive2", Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}),
        ("result", Op.TASK_RESULT, {"scope": "s", "task": task["id"]}),
    ]:
        rid = next_rid()
        assert core.handle(0.0, BOB, rid, op, args) is DEFERRED
        rids[rid] = name
    core.tick(1.5)  # receive times out
    call(core, 1.5, Op.CANCEL, {"request": next(r for r, n in rids.items() if n == "acquire")},
         BOB)
    call(core, 1.5, Op.CLAIM_RELEASE, {"lease": held["lease"]})  # acquire2 is granted
    call(core, 1.5, Op.SCOPE_CANCEL, {"scope": "s"})  # receive2 refused, result answered
    core.tick(4000.0)
    answers = [m[1] for conn, m in core.drain() if conn == BOB and m[0] != Kind.PUSH]
    assert sorted(answers) == sorted(rids)
