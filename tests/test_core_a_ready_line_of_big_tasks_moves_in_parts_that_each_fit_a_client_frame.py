"""A move between primaries sends its parts as client frames (SLOTS_IMPORT: at most
``MAX_FRAME_BYTES``, 1 MiB), each asked of the core at ``slotimport.PART_BYTES`` (half
of it). A ready line of big tasks is one SNAP_QUEUED record per sixteen items (up to
4 MiB): the export cuts such a record into smaller ones of the same line, in order, so
every part fits the budget and the line arrives whole and in order. (Before, the record
went whole into one part of 2.4 MiB, the source's frame encoder refused it, and the move
died unanswered: found by the slot-move fault tests.)"""

from __future__ import annotations

from typing import Any

import msgpack
from support.twoshards import move, placed, shard, slot

from rsd.core import Rec
from rsd.core.run.items import queued_items
from rsd.wire.slotimport import PART_BYTES
from rsproto import MAX_FRAME_BYTES, Op

RUN = placed("line")
BIG = "x" * (200 << 10)  # 200 KiB of task data: twelve are one SNAP_QUEUED of 2.4 MiB


def _items(parts: list[Any]) -> list[Any]:
    """Every record of ``parts`` in order, a SNAP_QUEUED as the items it holds."""
    return [item for part in parts for rec in part[3]
            for item in (queued_items(rec) if rec[0] == Rec.SNAP_QUEUED else [rec])]


def test_a_ready_line_of_big_tasks_moves_in_parts_each_under_a_client_frame() -> None:
    a, b = shard("a", 1), shard("b", 2)
    a.create_runs(RUN)
    for n in range(12):
        a.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "key": f"k{n}", "data": BIG})
    a.drain()
    parts = a.export_slots(slot(RUN), slot(RUN), PART_BYTES)
    assert len(parts) >= 5
    for part in parts:
        assert len(msgpack.packb(part, use_bin_type=True)) <= PART_BYTES + (64 << 10)
    assert PART_BYTES + (64 << 10) < MAX_FRAME_BYTES
    assert _items(parts) == _items(a.export_slots(slot(RUN), slot(RUN)))  # whole, in order
    move(a, b, slot(RUN))
    assert b.call(Op.QUEUE_INSPECT, {"scope": RUN, "mailbox": "jobs"})["ready"] == 12
    for n in range(12):  # the line kept its order
        delivery = b.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"})["delivery"]
        assert (delivery["key"], delivery["data"]) == (f"k{n}", BIG)
