"""The stored size of a payload, measured once by the handler that took it in, travels in
the record that stores it (ITEM_ENQUEUED's data_size, FINISHED's outcome_size), on the
pure core: there is no side channel between an op and its applier, replay charges the
same bytes without measuring again, and a record without the size (older files, a dead
letter enqueued again) is measured when applied.
"""

from __future__ import annotations

from typing import Any

from support.core import ALICE, HOLDERS, CoreDriver, on_disk

from rsd.core.ground.payloads import stored_size
from rsd.core.ground.tenants import TenantLimits
from rsd.core.records import Rec
from rsd.core.records.itemrecords import Finished, ItemEnqueued
from rsproto import Op

BOX = {"scope": "s", "mailbox": "jobs"}
DATA = {"input": "x" * 300, "n": [1, 2, 3]}
OUTCOME = {"result": "y" * 200}


def driver() -> CoreDriver:
    return CoreDriver(holders={ALICE: HOLDERS[ALICE]},
                      tenant_limits=TenantLimits(payload_bytes=1 << 20))


def used(core: CoreDriver) -> int:
    return core.tenant_usage("default")["payload_bytes"]


def drained(core: CoreDriver) -> list[Any]:
    """Every record the core made so far."""
    return list(core.records) + list(core.effects.records)


def test_the_measured_sizes_are_in_the_records_and_replay_charges_them() -> None:
    core = driver()
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "k"})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA})
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    assert delivery["id"] == task["id"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": OUTCOME})
    records = drained(core)
    enqueued = [rec for rec in records if rec[0] == Rec.ITEM_ENQUEUED]
    finished = [rec for rec in records if rec[0] == Rec.FINISHED]
    assert len(enqueued) == 2 and len(finished) == 1
    assert all(ItemEnqueued(*rec).data_size == stored_size(DATA) for rec in enqueued)
    assert Finished(*finished[0]).outcome_size == stored_size(OUTCOME)
    assert used(core) == 2 * stored_size(DATA) + stored_size(OUTCOME)
    assert used(core.replay(records)) == used(core)


def test_a_record_without_the_size_is_measured_when_applied() -> None:
    core = driver()
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "k"})
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    assert delivery["id"] == task["id"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": OUTCOME})
    cut = []
    for rec in drained(core):
        rec = on_disk(rec)
        if rec[0] == Rec.ITEM_ENQUEUED:
            rec = rec[:11]  # as version 4 wrote it: no needs, no size
        elif rec[0] == Rec.FINISHED:
            rec = rec[:8]
        cut.append(rec)
    assert used(core.replay(cut)) == used(core) == stored_size(DATA) + stored_size(OUTCOME)
