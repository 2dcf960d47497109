"""A task submitted with links (``after``, ``on_parent_failure``, ``parent``) is made by one
journal record, its ITEM_ENQUEUED carrying the links, as a plain task is: a fan-out of
1,000 children writes 1,000 records, not 2,000 (bench/fanout.py). The links' rules and
their replay: tests/test_core_a_task_after_its_parents_starts_only_when_they_succeed.py.
"""

from __future__ import annotations

from typing import Any

from support.core import ALICE, CoreDriver

from rsd.core.records import Rec
from rsd.core.records.itemrecords import ItemEnqueued
from rsproto import Op


def submit(core: CoreDriver, data: Any = None, **extra: Any) -> dict[str, Any]:
    return core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": data, **extra},
                     ALICE)


def test_a_task_with_links_is_made_by_one_record() -> None:
    core = CoreDriver()
    root = submit(core, "root")["id"]
    core.drain()
    before = len(core.records)
    kid = submit(core, "kid", after=[root], parent=root, on_parent_failure="run")["id"]
    core.drain()
    written = core.records[before:]
    assert [(rec[0], rec[1]) for rec in written] == [(Rec.ITEM_ENQUEUED, kid)]
    enqueued = ItemEnqueued(*written[0])
    assert (enqueued.parents, enqueued.on_parent_failure, enqueued.parent) == (
        [root], "run", root)


def test_a_task_without_links_carries_none() -> None:
    core = CoreDriver()
    plain = submit(core, "plain")["id"]
    core.drain()
    enqueued = ItemEnqueued(*next(rec for rec in core.records if rec[1] == plain))
    assert (enqueued.parents, enqueued.on_parent_failure, enqueued.parent) == (
        None, None, None)
