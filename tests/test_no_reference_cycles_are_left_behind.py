"""Serving leaves no reference cycles behind: state is freed by reference counting.

rsd never runs a full garbage collection over its live state (collector.py): it freezes
what survives, and a cycle that becomes garbage after it was frozen is never reclaimed.
So every op family, its timers and its error paths must free what they made without
the cyclic collector. These tests run a long workload with the collector off and then
ask it what it would have found: nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rsd.core import CoreError
from rsproto import Op
from tests.support.core import ALICE, BOB, CAROL, DAVE, CoreDriver

ROUNDS = 40
NOTHING = 0  # unreachable objects a workload may leave: none


@contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector off for the block (what rsd's frozen heap amounts to), with
    everything made before it collected first so the count is the block's alone."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def attempt(core: CoreDriver, op: int, args: dict[str, Any], conn: int = ALICE) -> Any:
    """A request that may be refused; the reply, or the refusal's code (the exception is
    dropped here, so its traceback holds no frame of the caller's)."""
    try:
        return core.call(op, args, conn)
    except CoreError as exc:
        return exc.code


def one_round(core: CoreDriver, n: int) -> None:
    """Every op family once, with waits granted, waits timing out, leases expiring,
    retries, dead letters, group waits and a run cancelled with work still in it."""
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    doomed = core.call(Op.SCOPE_CREATE, {})["scope"]
    # Claims: a grant, a waiter granted at release, a waiter timing out, renewals,
    # fence checks, and a lease left to expire.
    first = core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k", "lease_seconds": 5})
    core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k", "wait": True}, BOB)
    core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k", "wait": True, "timeout_ms": 50},
              CAROL)
    attempt(core, Op.CLAIM_ACQUIRE, {"scope": run, "key": "k"}, DAVE)  # CLAIM_HELD
    core.call(Op.LEASE_RENEW, {"leases": [first["lease"], b"\x00" * 16]})
    core.call(Op.FENCE_CHECK, {"scope": run, "key": "k", "token": first["lease"]})
    core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": f"left-{n}", "lease_seconds": 5}, DAVE)
    core.advance(0.1)  # CAROL's wait times out
    core.call(Op.CLAIM_RELEASE, {"lease": first["lease"]})  # BOB is granted
    attempt(core, Op.CLAIM_RELEASE, {"lease": first["lease"]})  # STALE_CLAIM
    # Tasks and messages: submit, join, result waits, receive, complete, reject, retry,
    # release, a lease expiring (requeue), a dead letter, a cancel, a group and needs.
    tasks = [
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "key": f"t{i}",
                                   "data": {"i": i}, "group": "g"})["id"]
        for i in range(5)
    ]
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "key": "t0", "data": {"i": 0},
                               "group": "g"}, BOB)  # joins
    attempt(core, Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "key": "t0", "data": 1})
    core.call(Op.TASK_RESULT, {"scope": run, "task": tasks[0]}, DAVE)  # waits for it
    core.call(Op.TASK_RESULT, {"scope": run, "task": tasks[4], "timeout_ms": 50}, DAVE)
    core.call(Op.GROUP_WAIT, {"scope": run, "group": "g", "need": 2})
    core.call(Op.MESSAGE_SEND, {"scope": run, "mailbox": "jobs", "data": "hello"})
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "once", "data": "doomed"})
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": "gpu",
                               "needs": {"pools": ["gpu"]}})
    core.call(Op.TASK_SUBMIT_MANY, {"scope": run, "mailbox": "jobs",
                                    "items": [{"data": j} for j in range(3)]})
    got = core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", "lease_seconds": 5,
                                 "max": 8}, CAROL)["deliveries"]
    assert len(got) >= 5
    core.call(Op.DELIVERY_COMPLETE, {"lease": got[0]["lease"], "result": {"ok": n},
                                     "next": {"max": 1}}, CAROL)
    core.call(Op.DELIVERY_REJECT, {"lease": got[1]["lease"], "reason": "bad"}, CAROL)
    core.call(Op.DELIVERY_RETRY, {"lease": got[2]["lease"]}, CAROL)
    core.call(Op.DELIVERY_RELEASE, {"lease": got[3]["lease"]}, CAROL)
    attempt(core, Op.DELIVERY_COMPLETE, {"lease": got[0]["lease"], "result": 1}, CAROL)
    once = core.call(Op.RECEIVE, {"scope": run, "mailbox": "once", "lease_seconds": 5}, BOB)
    assert once["delivery"] is not None
    core.call(Op.TASK_CANCEL, {"scope": run, "task": tasks[4]})
    core.call(Op.TASK_STATUS, {"scope": run, "task": tasks[1]})
    core.call(Op.RECEIVE, {"scope": run, "mailbox": "empty", "wait": True, "timeout_ms": 50},
              DAVE)
    # Pools and quotas: a grant, a waiter granted at release, a waiter timing out.
    slot = core.call(Op.POOL_ACQUIRE, {"pool": "gpu", "scope": run, "lease_seconds": 5})
    core.call(Op.POOL_ACQUIRE, {"pool": "gpu", "scope": run, "wait": True}, BOB)
    core.call(Op.POOL_ACQUIRE, {"pool": "gpu", "scope": run, "wait": True, "timeout_ms": 50},
              CAROL)
    core.call(Op.QUOTA_TAKE, {"scope": run, "quota": "q", "amount": 1})
    attempt(core, Op.QUOTA_TAKE, {"scope": run, "quota": "q", "amount": 1})  # exhausted
    core.call(Op.QUOTA_TAKE, {"scope": run, "quota": "q", "wait": True, "timeout_ms": 50}, BOB)
    core.advance(0.1)  # the waits above time out
    core.call(Op.POOL_RELEASE, {"lease": slot["lease"]})
    # A run cancelled with claims, tasks and waits in it; a connection that goes away.
    core.call(Op.CLAIM_ACQUIRE, {"scope": doomed, "key": "x"})
    core.call(Op.CLAIM_ACQUIRE, {"scope": doomed, "key": "x", "wait": True}, BOB)
    core.call(Op.TASK_SUBMIT, {"scope": doomed, "mailbox": "jobs", "data": "never"})
    core.call(Op.SCOPE_CANCEL, {"scope": doomed, "reason": "stop"})
    core.disconnected(DAVE)
    core.connected(DAVE, "dave", tenant="default", admin=True)
    core.advance(6)  # leases expire: claims, deliveries (requeued, dead-lettered), slots
    core.advance(61)  # quotas refill, retention and tombstones end, runs are forgotten
    core.drain()


def test_a_long_core_workload_of_every_op_family_leaves_no_cycles() -> None:
    core = CoreDriver(retention_seconds=30, tombstone_seconds=30)
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    core.call(Op.MAILBOX_ENSURE, {"name": "empty"})
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 2})
    core.call(Op.QUOTA_ENSURE, {"name": "q", "limit": 1, "per_seconds": 5})
    one_round(core, 0)  # first-use allocations (interned names, caches) happen here
    with collector_off():
        for n in range(1, ROUNDS):
            one_round(core, n)
        found = gc.collect()
    counts = core.effects.counts
    assert counts["dead letter"] >= ROUNDS and counts["run cancelled"] >= ROUNDS
    assert counts["delivery lease expired"] >= ROUNDS
    assert found == NOTHING, f"{found} objects in reference cycles were left behind"
