"""A task submitted after a parent and as its child leaves one object more than a plain
task for the collector to trace (its links: run/links.py), not a copy of its parents
beside them: its parents are its record's list, shared (work/parents.py). Each traced
object a task leaves makes the young collections come sooner while 1,000 children are
submitted (bench/fanout.py). Nothing here measures time: the collector's own count of
the tracked objects made and not freed (``gc.get_count``), with the collector off.
"""

from __future__ import annotations

import gc
from typing import Any

from support.core import ALICE, CoreDriver

from rsproto import Op

TASKS = 1000


def left_per_task(core: CoreDriver, run: str, **links: Any) -> float:
    """Tracked objects each of ``TASKS`` submits into ``run`` leaves, its records taken."""
    requests = [{"scope": run, "mailbox": "jobs", "data": n, **links} for n in range(TASKS)]
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for request in requests:
            core.call(Op.TASK_SUBMIT, request, ALICE)
        core.drain()
        core.records.clear()  # (written and gone, as the journal's are)
        return (gc.get_count()[0] - before) / TASKS
    finally:
        gc.enable()


def test_a_child_leaves_one_object_more_than_a_plain_task() -> None:
    core = CoreDriver(runs=("plain", "kids"))
    core.call(Op.MAILBOX_ENSURE, {"name": "roots"}, ALICE)
    root = core.call(Op.TASK_SUBMIT, {"scope": "kids", "mailbox": "roots", "data": 0}, ALICE)
    core.call(Op.RECEIVE, {"scope": "kids", "mailbox": "roots"}, ALICE)  # RUNNING
    links = {"after": [root["id"]], "parent": root["id"]}
    for run, more in (("plain", {}), ("kids", links)):  # what a first call makes once
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": 0, **more}, ALICE)
    core.drain()
    plain = left_per_task(core, "plain")
    child = left_per_task(core, "kids", **links)
    assert child - plain < 1.2, (child, plain)
