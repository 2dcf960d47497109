"""Each tenant's stored payload bytes follow what it stores, through every op family.

A random workload of two tenants on the pure core (fake clock), near a small byte limit so
that refusals happen too: submits (keyed, grouped, with subscribers and deadlines), batches
refused in part, sends with work keys, deliveries completed with outcomes, retried,
released, rejected into a short dead-letter list (evictions), requeued, cancelled while
running, group waits that cancel the rest, joins and detaches, run cancels in slices,
connections lost with deliveries in flight, retention and tombstones. After every step the
counters equal a walk of every table; at the end a journal replay and a snapshot restore
rebuild the same usage, and once everything is forgotten nothing is left charged.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, next_rid, on_disk
from test_core_memory_follows_live_objects import walked_usage

from rsd.core import CoreError
from rsd.core.ground.tenants import TenantLimits
from rsd.core.restore import Restore
from rsproto import Limits, Op

TENANTS = {ALICE: ("acme", True), CAROL: ("acme", False), BOB: ("globex", True)}


def usage(core: CoreDriver) -> dict[str, dict[str, int]]:
    return {t: core.tenant_usage(t) for t in ("acme", "globex")}


def assert_exact(core: CoreDriver) -> None:
    walked = walked_usage(core)
    for tenant in ("acme", "globex"):
        assert core.tenant_usage(tenant) == walked.get(tenant, core.tenant_usage("none")), tenant


def workload(core: CoreDriver, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    deliveries: list[tuple[int, bytes]] = []
    tasks: list[tuple[int, str, str]] = []

    def attempt(op: int, args: dict[str, Any], conn: int, rid: int | None = None) -> Any:
        try:
            return core.call(op, args, conn, rid=rid)
        except CoreError:
            return None

    def data() -> Any:
        return rng.choice([None, 1, "x" * rng.randrange(200), {"pad": "y" * rng.randrange(400)}])

    for _ in range(steps):
        conn = rng.choice([ALICE, CAROL, BOB])
        scope = f"r{rng.randrange(4)}"
        box = {"scope": scope, "mailbox": "jobs"}
        what = rng.randrange(16)
        if rng.random() < 0.2:
            attempt(Op.SCOPE_CREATE, {"scope": scope}, conn)
        if what == 0:
            args = {**box, "data": data(), "key": rng.choice([None, f"k{rng.randrange(6)}"]),
                    "subscriber_id": rng.choice([None, "sub" * rng.randrange(1, 4)]),
                    "group": rng.choice([None, "g"]),
                    "deadline": rng.choice([None, core.tables.wall(core.now) + 30])}
            reply = attempt(Op.TASK_SUBMIT, args, conn)
            if reply is not None:
                tasks.append((conn, scope, reply["id"]))
        elif what == 1:
            items = [{"data": data(), "key": rng.choice([None, f"m{rng.randrange(6)}"])}
                     for _ in range(rng.randrange(1, 6))]
            reply = attempt(Op.TASK_SUBMIT_MANY, {**box, "items": items}, conn)
            for result in (reply or {}).get("results", []):
                if "id" in result:
                    tasks.append((conn, scope, result["id"]))
        elif what == 2:
            attempt(Op.MESSAGE_SEND, {**box, "data": data(),
                                      "work_key": rng.choice([None, f"w{rng.randrange(6)}"])},
                    conn)
        elif what in (3, 4):
            got = attempt(Op.RECEIVE, {**box, "max": rng.randrange(1, 3)}, conn)
            for delivery in (got or {}).get("deliveries", []):
                deliveries.append((conn, delivery["lease"]))
        elif what in (5, 6) and deliveries:
            owner, lease = deliveries.pop(rng.randrange(len(deliveries)))
            op = rng.choice([Op.DELIVERY_COMPLETE, Op.DELIVERY_COMPLETE, Op.DELIVERY_RETRY,
                             Op.DELIVERY_RELEASE, Op.DELIVERY_REJECT])
            args = {"lease": lease}
            if op == Op.DELIVERY_COMPLETE:
                args["outcome"] = data()
            elif op == Op.DELIVERY_RETRY:
                args["delay_ms"] = rng.choice([0, 500])
            attempt(op, args, owner)
        elif what == 7 and tasks:
            owner, run, task = rng.choice(tasks)
            attempt(Op.TASK_CANCEL, {"scope": run, "task": task}, owner)
        elif what == 8 and tasks:
            owner, run, task = rng.choice(tasks)
            attempt(Op.TASK_JOIN, {"scope": run, "task": task,
                                   "subscriber_id": f"j{rng.randrange(3)}",
                                   "subscriber_scope": rng.choice([None, run])}, owner)
        elif what == 9 and tasks:
            owner, run, task = rng.choice(tasks)
            attempt(Op.TASK_DETACH, {"scope": run, "task": task,
                                     "subscriber_id": f"j{rng.randrange(3)}"}, owner)
        elif what == 10:
            attempt(Op.GROUP_WAIT, {"scope": scope, "group": "g", "need": rng.randrange(1, 3),
                                    "cancel_rest": True, "timeout_ms": rng.choice([0, 300])},
                    conn, next_rid())
        elif what == 11:
            attempt(Op.DEAD_LETTER_REQUEUE, {**box, "all": True, "limit": 2}, ALICE)
            attempt(Op.DEAD_LETTER_REQUEUE, {**box, "all": True, "limit": 2}, BOB)
            listed = attempt(Op.ADMIN_DEAD_LETTERS, {**box, "limit": 1}, BOB)
            if listed and listed["items"]:  # one deleted: its bytes go back
                attempt(Op.DEAD_LETTER_DELETE, {**box, "id": listed["items"][0]["id"]}, BOB)
        elif what == 12 and rng.random() < 0.03:
            attempt(Op.SCOPE_CANCEL, {"scope": scope}, conn)
        elif what == 13 and rng.random() < 0.2:
            lost = rng.choice([ALICE, CAROL, BOB])  # its deliveries go back to their queues
            core.disconnected(lost)
            core.connected(lost, HOLDERS[lost], tenant=TENANTS[lost][0], admin=TENANTS[lost][1])
            deliveries = [(c, lease) for c, lease in deliveries if c != lost]
        else:
            core.advance(rng.uniform(0.0, 3.0))
        core.drain()
        assert_exact(core)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stored_bytes_equal_a_walk_through_every_op_family_replay_and_snapshot(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_DEAD_LETTERS", 3)  # evictions happen
    core = CoreDriver(
        holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS,
        tenant_limits=TenantLimits(payload_bytes=2500), retention_seconds=20,
        tombstone_seconds=20, dedupe_seconds=20, run_retention_seconds=40,
        runs=("r0", "r1", "r2", "r3"),
    )
    for conn in (ALICE, BOB):
        core.call(Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 2,
                                      "retry_backoff_ms": 0}, conn)
    workload(core, seed, 1500)
    before = usage(core)
    assert before["acme"]["payload_bytes"] > 0 or before["globex"]["payload_bytes"] > 0
    assert usage(core.replay()) == before
    restored = core.fresh()
    Restore(restored).apply([on_disk(rec) for rec in core.snapshot()], core.now)
    assert usage(restored) == before
    for conn in TENANTS:
        core.disconnected(conn)
    for _ in range(20):
        core.advance(30.0)
    core.drain()
    assert_exact(core)
    # Dead letters are kept until requeued, unfinished items until done; finished ones
    # are forgotten by now.
    left = {item.state for item in core.work.items.values()}
    assert left <= {"PENDING"}, left
    unfinished = sum(item.size for item in core.work.items.values())
    dead = sum(
        len(msgpack.packb(entry["data"])) if entry["data"] is not None else 0
        for scope in core.scopes.values() for queue in scope.queues.values()
        for entry in queue.dead_letters
    )
    subs = sum(len(sub) + len(sub_scope or "") for item in core.work.items.values()
               for sub, sub_scope in item.subscribers.items())
    assert sum(u["payload_bytes"] for u in usage(core).values()) == dead + unfinished + subs
