"""Waiters met together share one reply, and a reply's outcomes stay under the frame limit.

Found by an adversarial client: 2,000 GROUP_WAITs parked for all 2,000 tasks of a group
cost the success that met them 0.9 s and 770 MB (each waiter got a ``done`` list of its
own); at the limits (10,000 waiters on 10,000 tasks) that is 10^8 entries, tens of GB.
And GROUP_WAIT with outcomes on 10,000 successes of 256 KiB each encoded a 2.5 GB reply
before finding it over the frame limit. On the pure core: the waiters met in one step get
one shared reply per ``outcomes`` flag, and outcomes past MAX_FRAME_BYTES are refused
(RESOURCE_EXHAUSTED, naming the limit) without building the rest.
"""

from __future__ import annotations

from typing import Any

from support.core import BOB, CAROL, CoreDriver, next_rid

from rsd.core import DEFERRED
from rsproto import ErrorCode, Kind, Limits, Op

BIG = b"x" * (Limits.MAX_PAYLOAD_BYTES - 16)  # one outcome just under the payload limit


def group_of(core: CoreDriver, count: int) -> list[bytes]:
    """``count`` tasks in group "g", all delivered to BOB; their delivery leases."""
    items = [{"key": f"k{i}", "data": None, "group": "g"} for i in range(count)]
    for start in range(0, count, 256):
        core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs",
                                        "items": items[start : start + 256]})
    leases: list[bytes] = []
    while len(leases) < count:
        got = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "max": 256}, BOB)
        leases += [d["lease"] for d in got["deliveries"]]
    core.drain()
    return leases


def park(core: CoreDriver, args: dict[str, Any], count: int) -> set[int]:
    rids = set()
    for _ in range(count):
        rid = next_rid()
        assert core.handle(core.now, CAROL, rid, Op.GROUP_WAIT, {"scope": "s", "group": "g",
                                                                  **args}) is DEFERRED
        rids.add(rid)
    return rids


def test_waiters_met_by_one_success_share_one_done_list_per_outcomes_flag() -> None:
    core = CoreDriver(recovered=True)
    tasks = 300
    leases = group_of(core, tasks)
    with_outcomes = park(core, {"need": tasks}, 400)
    without = park(core, {"need": tasks, "outcomes": False}, 400)
    for lease in leases:
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": 1}, BOB)
    replies = {m[1]: m[2] for _, m in core.drain() if m[0] == Kind.REPLY}
    assert with_outcomes | without <= set(replies)
    shared = {id(replies[rid]["done"]) for rid in with_outcomes}
    assert len(shared) == 1 and len({id(replies[rid]["done"]) for rid in without}) == 1
    assert replies[next(iter(with_outcomes))]["done"][0]["outcome"] == 1
    assert "outcome" not in replies[next(iter(without))]["done"][0]
    assert all(len(replies[rid]["done"]) == tasks for rid in with_outcomes | without)


def test_outcomes_past_the_frame_limit_are_refused_and_cancel_nothing() -> None:
    core = CoreDriver(recovered=True)
    leases = group_of(core, 6)
    for lease in leases[:5]:  # five outcomes of 256 KiB: past 1 MiB together
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": BIG}, BOB)
    wait = {"scope": "s", "group": "g", "need": 5, "cancel_rest": True}
    refused = core.refused(Op.GROUP_WAIT, wait)
    assert refused.code == ErrorCode.RESOURCE_EXHAUSTED
    assert str(Limits.MAX_FRAME_BYTES) in refused.message and "outcomes false" in refused.message
    assert core.call(Op.GROUP_STATUS, {"scope": "s", "group": "g"})["unfinished"] == 1
    reply = core.call(Op.GROUP_WAIT, {**wait, "outcomes": False})
    assert reply["reached"] and len(reply["done"]) == 5 and reply["cancelled"] == 1


def test_a_parked_wait_met_with_too_many_outcome_bytes_gets_the_error() -> None:
    core = CoreDriver(recovered=True)
    leases = group_of(core, 5)
    (rid,) = park(core, {"need": 5}, 1)
    for lease in leases:
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": BIG}, BOB)
    answers = [m for _, m in core.drain() if m[1] == rid]
    assert len(answers) == 1 and answers[0][0] == Kind.ERROR
    assert answers[0][2] == ErrorCode.RESOURCE_EXHAUSTED
