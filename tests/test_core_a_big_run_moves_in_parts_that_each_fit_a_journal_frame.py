"""A run whose state is larger than a journal frame may hold (8 MiB) is exported in
several RUNS_IMPORTED records, each at most PART_BYTES encoded (transfer.py), imported
in order into the same state as in one; each part is a record of its own in the
target's journal, which replays to the same state."""

from __future__ import annotations

from typing import Any

import msgpack
from support.core import on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core import Rec
from rsd.core.run.items import queued_items
from rsd.core.transfer import PART_BYTES
from rsd.disk.logfile import MAX_RECORD_BYTES
from rsproto import Op

RUN = placed("big")


def _items(parts: list[Any]) -> list[Any]:
    """Every record of ``parts`` in order, a SNAP_QUEUED as the items it holds."""
    return [item for part in parts for rec in part[3]
            for item in (queued_items(rec) if rec[0] == Rec.SNAP_QUEUED else [rec])]
BIG = "x" * (200 << 10)  # 200 KiB of task data, stored as it is


def test_a_big_run_moves_in_parts_each_under_a_frame() -> None:
    a, b = shard("a", 1), shard("b", 2)
    a.create_runs(RUN)
    for n in range(60):  # 12 MiB of data
        a.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "key": f"k{n}", "data": BIG})
    a.drain()
    parts = a.export_slots(slot(RUN), slot(RUN))
    assert len(parts) >= 3
    for part in parts:
        assert len(msgpack.packb(part, use_bin_type=True)) <= PART_BYTES + (1 << 20)
    assert PART_BYTES + (1 << 20) < MAX_RECORD_BYTES
    small = a.export_slots(slot(RUN), slot(RUN), part_bytes=1 << 20)  # a smaller channel
    assert len(small) > len(parts)
    # each within the budget: a SNAP_QUEUED of sixteen such tasks (3.2 MiB) is cut into
    # smaller ones of the same line, the same items in the same order
    assert all(len(msgpack.packb(p, use_bin_type=True)) <= (1 << 20) + (64 << 10)
               for p in small)
    assert _items(small) == _items(parts)
    assert move(a, b, slot(RUN)) == {"runs": 1, "records": sum(len(p[3]) for p in parts)}
    imported = [r for r in b.records if r[0] == Rec.RUNS_IMPORTED]
    assert len(imported) == len(parts)
    status = b.call(Op.QUEUE_INSPECT, {"scope": RUN, "mailbox": "jobs"})
    assert status["ready"] == 60
    first = b.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"})["delivery"]
    assert first["data"] == BIG and first["key"] == "k0"  # the line kept its order
    b.drain()
    replayed = b.replay()
    assert sorted(map(repr, map(on_disk, replayed.snapshot()))) == sorted(
        map(repr, map(on_disk, b.snapshot()))
    )
