"""The core's O(1) counts (items by state, each mailbox's ready and running depth, rare
events by name) always equal what a walk over the tables finds: after deliveries,
expiries, retries with backoff, dead letters, a cancelled run, forgetting, and after a
replay of the journal and a rebuild from a snapshot. The metrics and SERVER_STATS read
these counts at every scrape, so they must never drift."""

from __future__ import annotations

from collections import Counter

from rsd.core.run.items import State
from rsproto import Op
from tests.support.core import ALICE, BOB, CoreDriver


def walked_states(core: CoreDriver) -> dict[tuple[bool, State], int]:
    found = Counter((item.is_message, item.state) for item in core.work.items.values())
    return {key: found.get(key, 0) for key in core.work.by_state}


def walked_depths(core: CoreDriver) -> dict[tuple[str, str], tuple[int, int]]:
    depths: dict[tuple[str, str], list[int]] = {
        key: [0, 0] for key in core.work.mailboxes
    }
    for scope in core.scopes.values():
        for queue in scope.queues.values():
            entry = depths[(queue.tenant, queue.mailbox)]
            entry[0] += sum(1 for item in queue.ready if item.queued)
            entry[1] += queue.running
    return {key: (ready, running) for key, (ready, running) in depths.items()}


def counted_depths(core: CoreDriver) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        key: (box.depth.ready, box.depth.running) for key, box in core.work.mailboxes.items()
    }


def assert_counts_match(core: CoreDriver) -> None:
    assert core.work.by_state == walked_states(core)
    assert counted_depths(core) == walked_depths(core)
    assert all(count >= 0 for count in core.work.by_state.values())


def test_counts_follow_every_move_and_survive_replay_and_snapshot() -> None:
    core = CoreDriver(retention_seconds=30, tombstone_seconds=30)
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    core.call(Op.MAILBOX_ENSURE, {"name": "slow", "retry_backoff_ms": 60_000})
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    doomed = core.call(Op.SCOPE_CREATE, {})["scope"]
    for n in range(6):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": n})
    core.call(Op.MESSAGE_SEND, {"scope": run, "mailbox": "jobs", "data": "m"})
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "once", "data": "x"})
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "slow", "data": "y"})
    core.call(Op.TASK_SUBMIT, {"scope": doomed, "mailbox": "jobs", "data": "z"})
    assert core.work.by_state[(False, State.PENDING)] == 9
    assert core.work.by_state[(True, State.PENDING)] == 1
    assert core.work.mailboxes[("default", "jobs")].depth.ready == 8
    assert_counts_match(core)

    got = [
        core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", "lease_seconds": 5})["delivery"]
        for _ in range(4)
    ]
    once = core.call(Op.RECEIVE, {"scope": run, "mailbox": "once", "lease_seconds": 5})
    slow = core.call(Op.RECEIVE, {"scope": run, "mailbox": "slow"}, BOB)["delivery"]
    core.call(Op.RECEIVE, {"scope": doomed, "mailbox": "jobs"}, BOB)
    assert core.work.mailboxes[("default", "jobs")].depth.running == 5
    assert_counts_match(core)

    core.call(Op.DELIVERY_COMPLETE, {"lease": got[0]["lease"], "outcome": {"payload": 1}})
    core.call(Op.DELIVERY_REJECT, {"lease": got[1]["lease"], "reason": "bad"})
    core.call(Op.DELIVERY_RELEASE, {"lease": got[2]["lease"]})
    core.call(Op.DELIVERY_RETRY, {"lease": slow["lease"]}, BOB)  # waits out a backoff
    core.call(Op.SCOPE_CANCEL, {"scope": doomed, "reason": "stop"})
    assert once["delivery"] is not None
    assert_counts_match(core)
    core.drain()

    core.advance(6)  # got[3] is requeued, "once" is dead-lettered
    assert core.effects.counts["delivery lease expired"] == 2
    assert core.effects.counts["dead letter"] == 2  # the reject and the last attempt
    assert core.effects.counts["run cancelled"] == 1
    assert core.work.by_state[(False, State.FAILED)] == 2
    assert_counts_match(core)
    core.drain()

    replayed = core.replay()
    assert replayed.work.by_state == core.work.by_state
    assert counted_depths(replayed) == counted_depths(core)
    assert_counts_match(replayed)
    rebuilt = core.fresh()
    for rec in core.snapshot():
        rebuilt.apply(rec, core.now)
    assert rebuilt.work.by_state == core.work.by_state
    assert counted_depths(rebuilt) == counted_depths(core)

    core.advance(61)  # the backoff ends, results are tombstoned, then forgotten
    assert_counts_match(core)
    assert core.work.mailboxes[("default", "slow")].depth.ready == 1
    assert sum(core.work.by_state.values()) == len(core.work.items)


def test_an_expired_pool_slot_is_noted_with_its_ids() -> None:
    core = CoreDriver()
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    core.call(Op.POOL_ACQUIRE, {"pool": "gpu", "scope": run, "lease_seconds": 5}, ALICE)
    core.drain()
    core.advance(6)
    [(event, ids)] = core.effects.take_notes()[0]
    assert event == "slot lease expired"
    assert ids["pool"] == "gpu" and ids["scope"] == run and ids["holder"] == "alice"
    assert core.effects.counts["slot lease expired"] == 1


def test_counts_follow_blocked_items_batched_receives_and_settle_and_next() -> None:
    """Items that wait for capacity leave the ready count while they wait and come back
    when woken; a batched receive and a settlement's ``next`` move the counts like single
    ones; all of it survives replay."""
    core = CoreDriver()
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    needs = {"pools": ["gpu"]}
    for n in range(4):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": n, "needs": needs})
    for n in range(3):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": f"plain-{n}",
                                   "group": "g"})
    assert_counts_match(core)
    got = core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", "max": 8})["deliveries"]
    assert len(got) == 4  # one task needing the gpu, and the three needing nothing
    assert_counts_match(core)
    first = next(d for d in got if d["data"] == 0)
    settled = core.call(Op.DELIVERY_COMPLETE, {
        "lease": first["lease"], "result": {"payload": 1}, "next": {"max": 2},
    })
    assert_counts_match(core)
    core.advance(0.01)  # the freed slot wakes the tasks waiting for it
    assert_counts_match(core)
    again = core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", "max": 8})["deliveries"]
    assert [d["data"] for d in again] == [1]  # one slot: one of the tasks needing it
    assert_counts_match(core)
    for delivery in [*got[1:], *settled["next"], *again]:
        core.call(Op.DELIVERY_RETRY, {"lease": delivery["lease"]})
        assert_counts_match(core)
    for rebuilt in (core.replay(), core.replay(list(core.snapshot()))):
        assert_counts_match(rebuilt)
