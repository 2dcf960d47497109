"""A task submitted after one unfinished task alone (the fan-out's child: ``after=[root],
parent=root``, bench/fanout.py) keeps no list of its own for its parents: its links name
the tuple its parent keeps for all of them (run/links.py, ``Links.alone``), so the
request's ``after`` list goes with the request. Each request here is made fresh, as the
wire decodes one (test_core_a_child_leaves_one_object_more_than_a_plain_task.py builds
them all first, so a list a child kept is not counted there).

Nothing here measures time: the collector's own count of the tracked objects made and
not freed (``gc.get_count``), with the collector off.
"""

from __future__ import annotations

import gc
from typing import Any

from support.core import ALICE, CoreDriver

from rsproto import Op

TASKS = 1000


def left_per_task(core: CoreDriver, run: str, after: str | None = None) -> float:
    """Tracked objects each of ``TASKS`` submits into ``run`` leaves, each request made
    just before its submit and dropped after it, its records taken."""
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for n in range(TASKS):
            request: dict[str, Any] = {"scope": run, "mailbox": "jobs", "data": n}
            if after is not None:
                request["after"], request["parent"] = [after], after
            core.call(Op.TASK_SUBMIT, request, ALICE)
            del request
        core.drain()
        core.records.clear()  # (written and gone, as the journal's are)
        return (gc.get_count()[0] - before) / TASKS
    finally:
        gc.enable()


def test_a_child_after_its_parent_alone_keeps_no_list_of_its_own() -> None:
    core = CoreDriver(runs=("plain", "kids"))
    core.call(Op.MAILBOX_ENSURE, {"name": "roots"}, ALICE)
    root = core.call(Op.TASK_SUBMIT, {"scope": "kids", "mailbox": "roots", "data": 0}, ALICE)
    core.call(Op.RECEIVE, {"scope": "kids", "mailbox": "roots"}, ALICE)  # RUNNING
    core.call(Op.TASK_SUBMIT, {"scope": "plain", "mailbox": "jobs", "data": 0}, ALICE)
    core.call(Op.TASK_SUBMIT, {"scope": "kids", "mailbox": "jobs", "data": 0,  # its tuple
                               "after": [root["id"]], "parent": root["id"]}, ALICE)
    core.drain()
    plain = left_per_task(core, "plain")
    child = left_per_task(core, "kids", after=root["id"])
    assert child - plain < 1.2, (child, plain)  # its links, and nothing more
