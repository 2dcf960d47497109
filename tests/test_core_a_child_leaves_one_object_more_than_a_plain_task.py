"""A task submitted after a parent and as its child leaves one object more than a plain
task for the collector to trace (its links: run/links.py), not a copy of its parents
beside them: its parents are its record's list, shared (work/parents.py); and a task
after one unfinished task alone (the fan-out's child: ``after=[root], parent=root``)
keeps no list of its own either: its links name the tuple its parent keeps for all of
them (``Links.alone``), so the request's ``after`` list goes with the request. Each traced
object a task leaves makes the young collections come sooner while 1,000 children are
submitted (bench/fanout.py). Nothing here measures time: the collector's own count of
the tracked objects made and not freed (``gc.get_count``), with the collector off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

from support.core import ALICE, CoreDriver

from rsproto import Op

TASKS = 1000


def left_per_task(core: CoreDriver, run: str, fresh: bool, **links: Any) -> float:
    """Tracked objects each of ``TASKS`` submits into ``run`` leaves, its records taken.
    ``fresh``: each request made just before its submit and dropped after it, as the wire
    decodes one (a list a task kept of its request is then counted); else all made first."""

    def made(n: int) -> dict[str, Any]:
        return {"scope": run, "mailbox": "jobs", "data": n,
                **{key: list(value) if isinstance(value, list) else value
                   for key, value in links.items()}}

    ahead = [] if fresh else [made(n) for n in range(TASKS)]

    def requests() -> Iterator[dict[str, Any]]:
        yield from (made(n) for n in range(TASKS)) if fresh else ahead

    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for request in requests():
            core.call(Op.TASK_SUBMIT, request, ALICE)
            del request
        core.drain()
        core.records.clear()  # (written and gone, as the journal's are)
        return (gc.get_count()[0] - before) / TASKS
    finally:
        gc.enable()


def a_core_with_a_running_root() -> tuple[CoreDriver, dict[str, Any]]:
    """Runs "plain" and "kids", a RUNNING root in "kids", and one task of each kind made
    (what a first call makes once is not counted)."""
    core = CoreDriver(runs=("plain", "kids"))
    core.call(Op.MAILBOX_ENSURE, {"name": "roots"}, ALICE)
    root = core.call(Op.TASK_SUBMIT, {"scope": "kids", "mailbox": "roots", "data": 0}, ALICE)
    core.call(Op.RECEIVE, {"scope": "kids", "mailbox": "roots"}, ALICE)  # RUNNING
    links = {"after": [root["id"]], "parent": root["id"]}
    for run, more in (("plain", {}), ("kids", links)):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": 0, **more}, ALICE)
    core.drain()
    return core, links


def test_a_child_leaves_one_object_more_than_a_plain_task() -> None:
    core, links = a_core_with_a_running_root()
    plain = left_per_task(core, "plain", fresh=False)
    child = left_per_task(core, "kids", fresh=False, **links)
    assert child - plain < 1.2, (child, plain)


def test_a_child_after_its_parent_alone_keeps_no_list_of_its_own() -> None:
    core, links = a_core_with_a_running_root()
    plain = left_per_task(core, "plain", fresh=True)
    child = left_per_task(core, "kids", fresh=True, **links)
    assert child - plain < 1.2, (child, plain)  # its links, and nothing more
