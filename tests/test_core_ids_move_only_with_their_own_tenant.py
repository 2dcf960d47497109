"""A tenant's lease and item ids move only with its own activity.

Ids drawn from one server-wide counter let a tenant read others' rates off the gaps in
its own ids. Each tenant has its own counters (rsd/core/ground/ids.py): its sequence is the
same whatever other tenants do. Ids stay unique (item ids carry the tenant's name but
for the default tenant's), never go back, and a replay or a snapshot rebuilds the same
counters; an unclean restart jumps every tenant's counters to the durable ceiling.
On a fake clock (support/core.py); nothing sleeps.
"""

from __future__ import annotations

import itertools
from typing import Any

from support.core import ALICE, BOB, HOLDERS, CoreDriver, lease_id, on_disk

from rsd.core import Rec
from rsproto import Op

TENANTS = {ALICE: ("acme", True), BOB: ("globex", True)}
BOX = {"scope": "s", "mailbox": "jobs"}
_keys = itertools.count()


def tenants_core() -> CoreDriver:
    return CoreDriver(holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS)


def activity(core: CoreDriver, conn: int, rounds: int) -> list[Any]:
    """Submit, deliver, complete and claim ``rounds`` times; the ids ``conn`` was given."""
    seen: list[Any] = []
    for n in range(rounds):
        seen.append(core.call(Op.TASK_SUBMIT, {**BOX, "data": n}, conn)["id"])
        seen.append(core.call(Op.MESSAGE_SEND, {**BOX, "data": n}, conn)["id"])
        for _ in range(2):
            delivery = core.call(Op.RECEIVE, BOX, conn)["delivery"]
            seen.append(lease_id(delivery["lease"]))
            core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]}, conn)
        grant = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{next(_keys)}"}, conn)
        seen.append(lease_id(grant["lease"]))
    return seen


def test_a_tenants_ids_do_not_move_with_another_tenants_activity() -> None:
    quiet, busy = tenants_core(), tenants_core()
    alone = [activity(quiet, ALICE, 1) for _ in range(5)]
    beside = []
    for _ in range(5):
        activity(busy, BOB, 37)  # globex works hard between acme's requests
        beside.append(activity(busy, ALICE, 1))
    assert beside == alone
    assert alone[0][:2] == ["t-1.acme", "m-2.acme"]  # its own namespace, from 1


def test_ids_are_unique_across_tenants_and_never_go_back() -> None:
    core = tenants_core()
    acme, globex = activity(core, ALICE, 20), activity(core, BOB, 20)
    items = [i for i in acme + globex if isinstance(i, str)]
    assert len(set(items)) == len(items)
    for ids in (acme, globex):
        leases = [i for i in ids if isinstance(i, int)]
        assert leases == sorted(leases) and len(set(leases)) == len(leases)


def test_the_default_tenant_keeps_plain_ids() -> None:
    core = CoreDriver()
    assert core.call(Op.TASK_SUBMIT, {**BOX, "data": 1})["id"] == "t-1"


def test_replay_and_a_snapshot_rebuild_each_tenants_counters() -> None:
    core = tenants_core()
    activity(core, ALICE, 3)
    activity(core, BOB, 5)
    core.drain()
    rebuilt = core.fresh(holders=HOLDERS)
    for rec in core.snapshot():
        rebuilt.apply(on_disk(rec), core.now)
    for again in (core.replay(), rebuilt):
        again.drain()
        assert again.leases.ids.next == core.leases.ids.next
        assert again.work.item_ids.next == core.work.item_ids.next
        assert again.work.new_id("t", "acme") == core.work.new_id("t", "acme")


def test_an_unclean_restart_jumps_every_tenants_counters_never_back() -> None:
    core = tenants_core()
    acme = activity(core, ALICE, 2)
    core.drain()
    rebuilt = core.replay()
    rebuilt.recovered(core.now, clean=False)
    for conn, tenant in TENANTS.items():
        rebuilt.connected(conn, HOLDERS[conn], tenant=tenant[0], admin=True)
    after = activity(rebuilt, ALICE, 1)
    assert int(after[0].split("-")[1].split(".")[0]) >= core.ids.item_ceiling
    assert min(i for i in after if isinstance(i, int)) > max(
        i for i in acme if isinstance(i, int)
    )


def test_a_plain_id_of_an_older_file_counts_in_the_default_namespace() -> None:
    """Before per-tenant counters every tenant's ids were plain ``t-N``: one of those
    (whatever its tenant) moves the default tenant's counter, so no id is given twice."""
    core = CoreDriver()
    core.apply((Rec.ITEM_ENQUEUED, "t-41", False, "s", "jobs", None, None, 1, 0.0, None,
                "acme"), core.now)
    assert core.call(Op.TASK_SUBMIT, {**BOX, "data": 1})["id"] == "t-42"
