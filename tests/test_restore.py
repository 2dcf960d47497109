"""Restoring a frame at a time (core/restore.py) builds exactly what record-by-record
application builds: the same items, tables, counts, indexes, ready lines in the same
order, timers and shared strings, for every kind of item a snapshot holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, on_disk

from rsd.core import Core, Rec
from rsd.core.ground.pages import PagedIndex
from rsd.core.restore import Restore
from rsd.core.run.items import QUEUED_FIELDS, QUEUED_PER_RECORD, queued_items
from rsd.disk.datadir import snapshot_name
from rsd.disk.logfile import (
    FORMAT_VERSION,
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SNAPSHOT_MAGIC,
    encode_batch,
    file_header,
    new_salt,
    records_of,
    scan,
)
from rsd.disk.recovery import RecoveryError
from rsd.startup import recover
from rsproto import Limits, Op

SALT = b"\x07" * 8

TENANTS = {ALICE: ("default", True), BOB: ("acme", True)}


def busy_core() -> CoreDriver:
    """A core holding every kind of item: queued tasks and messages (keyed or not, with
    a deadline, needs, a subscriber, a past retry), running ones, ones waiting out a
    backoff, finished and tombstoned ones, in two tenants, runs and mailboxes."""
    core = CoreDriver(tenants=TENANTS, runs=("s", "t"), retention_seconds=30.0)
    for conn in (ALICE, BOB):
        core.call(Op.MAILBOX_ENSURE, {"name": "slow", "retry_backoff_ms": 60_000}, conn)
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    for n in range(6):
        core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "slow", "data": n})
    running = [
        core.call(Op.RECEIVE, {"scope": "s", "mailbox": "slow", "lease_seconds": 600})
        for _ in range(3)
    ]
    core.call(Op.DELIVERY_COMPLETE, {"lease": running[0]["delivery"]["lease"], "outcome": 1})
    core.call(Op.DELIVERY_RETRY, {"lease": running[1]["delivery"]["lease"]})  # backoff
    core.advance(40)  # the completed task is tombstoned
    for conn in (ALICE, BOB):
        for run in ("s", "t"):
            for mailbox in ("jobs", "slow"):
                for n in range(25):
                    args: dict[str, Any] = {"scope": run, "mailbox": mailbox, "data": [n]}
                    if n % 3:
                        args["key"] = f"{mailbox}-k{n}"
                    if n % 5 == 0:
                        args["deadline"] = 1_700_001_000.0 + n
                    if n % 7 == 0 and conn == ALICE:
                        args["needs"] = {"pools": ["gpu"]}
                    if n % 11 == 0:
                        args["subscriber_id"] = f"sub-{n}"
                    core.call(Op.TASK_SUBMIT, args, conn)
                    if n % 4 == 0:
                        core.call(Op.MESSAGE_SEND, {
                            "scope": run, "mailbox": mailbox, "data": n,
                            **({"work_key": f"w{n}"} if n % 8 == 0 else {}),
                        }, conn)
    again = core.call(Op.RECEIVE, {"scope": "t", "mailbox": "jobs", "lease_seconds": 600})
    core.call(Op.DELIVERY_RETRY, {"lease": again["delivery"]["lease"], "delay_ms": 0})
    core.drain()
    return core


def fingerprint(core: Core) -> dict[str, Any]:
    """Everything restoring could get wrong, in order where order matters."""
    work = core.work
    scopes = {}
    for key, scope in sorted(core.scopes.items()):
        pages = scope.item_pages
        scopes[key] = {
            "tasks": list(scope.tasks),
            "live": list(scope.live_items),
            "counts": dict(scope.counts),
            "index": None if pages is None else [
                (list(block.seqs), [item.id for item in block.objs]) for block in pages.blocks
            ],
            "index_next": None if pages is None else pages.next_seq,
            "queues": {
                name: ([item.id for item in queue.queued()], queue.ready_count(),
                       queue.running, queue.delayed)
                for name, queue in scope.queues.items()
            },
        }
    for item in work.items.values():  # the strings shared as when made live
        scope = core.scopes[(item.tenant, item.scope)]
        assert item.scope is scope.id
        assert item.tenant is core.tenants.name(item.tenant)
        queue = scope.queues.get(item.mailbox)
        if queue is not None and item.queued:
            assert item.mailbox is queue.mailbox and item.tenant is queue.tenant
            assert (item.run is scope) is (not item.is_message)
    return {
        "snapshot": [on_disk(rec) for rec in core.snapshot()],
        "views": {item_id: item.view() for item_id, item in work.items.items()},
        "items": list(work.items),
        "by_state": dict(work.by_state),
        "usage": {name: usage.view() for name, usage in core.tenants.usage.items()},
        "depths": {key: (box.depth.ready, box.depth.running, dict(box.fairness_keys))
                   for key, box in work.mailboxes.items()},
        "scopes": scopes,
        "next_deadline": core.next_deadline(),
        "wheel": len(core.wheel),
        "queued": sorted(item.id for item in work.items.values() if item.queued),
    }


def rebuilt(core: CoreDriver, records: list[Any], frame: int | None) -> Core:
    """A fresh core rebuilt from ``records``: one by one (``frame`` None) or restored a
    frame of ``frame`` records at a time."""
    fresh = core.fresh()
    if frame is None:
        for rec in records:
            fresh.apply(rec, core.now)
    else:
        restore = Restore(fresh)
        for start in range(0, len(records), frame):
            restore.apply(records[start:start + frame], core.now)
    assert fresh.effects.take_records() == [] and fresh.effects.take_messages() == []
    return fresh


def as_version_3(records: list[Any]) -> list[Any]:
    """The records as a version 3 snapshot holds them: every item a SNAP_ITEM."""
    out: list[Any] = []
    for rec in records:
        out.extend(queued_items(rec) if rec[0] == Rec.SNAP_QUEUED else [rec])
    return [on_disk(rec) for rec in out]


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("frame", [1, 7, 64, 100_000])
def test_restoring_by_frames_builds_exactly_what_applying_record_by_record_builds(
    frame: int, version: int,
) -> None:
    core = busy_core()
    records = [on_disk(rec) for rec in core.snapshot()]
    if version == 3:
        records = as_version_3(records)
    expected = fingerprint(rebuilt(core, records, None))
    assert expected["snapshot"] == [on_disk(rec) for rec in core.snapshot()]
    assert fingerprint(rebuilt(core, records, frame)) == expected
    # Both paths are taken: only queued items are placed in bulk.
    fresh = core.fresh()
    restore = Restore(fresh)
    one_by_one: list[Any] = []
    restore.apply_one = lambda rec, now: one_by_one.append(rec) or fresh.apply(rec, now)
    restore.apply(records, core.now)
    slow = {rec[1] for rec in one_by_one if rec[0] == Rec.SNAP_ITEM}
    quick = [item for item in fresh.work.items.values() if item.id not in slow]
    assert len(quick) > 150 and len(slow) > 20
    assert all(item.queued for item in quick)


def test_a_snapshot_holds_plainly_queued_items_sixteen_to_a_record_in_line_order() -> None:
    plain = CoreDriver()
    for n in range(45):  # the tenth has a subscriber: a SNAP_ITEM between two runs
        args = {"scope": "s", "mailbox": "jobs", "data": n}
        plain.call(Op.TASK_SUBMIT, {**args, "subscriber_id": "x"} if n == 9 else args)
    plain.drain()
    kinds = [(rec[0], len(rec[4]) // QUEUED_FIELDS if rec[0] == Rec.SNAP_QUEUED else None)
             for rec in plain.snapshot() if rec[0] in (Rec.SNAP_QUEUED, Rec.SNAP_ITEM)]
    assert kinds == [(Rec.SNAP_QUEUED, 9), (Rec.SNAP_ITEM, None), (Rec.SNAP_QUEUED, 16),
                     (Rec.SNAP_QUEUED, 16), (Rec.SNAP_QUEUED, 3)]
    assert QUEUED_PER_RECORD == 16
    core = busy_core()
    records = list(core.snapshot())
    queued = [rec for rec in records if rec[0] == Rec.SNAP_QUEUED]
    assert queued and max(len(rec[4]) for rec in queued) <= QUEUED_PER_RECORD * QUEUED_FIELDS
    for scope in core.scopes.values():
        for name, queue in scope.queues.items():
            line = [item.id for item in queue.ready if item.queued]
            held = [
                item[1] for rec in as_version_3(records) if rec[0] == Rec.SNAP_ITEM
                for item in [rec] if (rec[20], rec[3], rec[4]) == queue_key(queue)
                and item[1] in line
            ]
            assert held == line, (scope.key, name)


def queue_key(queue: Any) -> tuple[str, str, str]:
    return (queue.tenant, queue.scope, queue.mailbox)


def test_sixteen_items_at_every_limit_fit_one_frame_and_read_back() -> None:
    """The bound of a SNAP_QUEUED record: its largest possible frame is readable."""
    core = CoreDriver()
    for n in range(QUEUED_PER_RECORD):
        core.call(Op.TASK_SUBMIT, {
            "scope": "s", "mailbox": "jobs", "key": f"{n:02d}" + "k" * (Limits.MAX_KEY_BYTES - 2),
            "data": bytes([n]) * (Limits.MAX_PAYLOAD_BYTES - 16),
        })
    core.drain()
    [rec] = [rec for rec in core.snapshot() if rec[0] == Rec.SNAP_QUEUED]
    frame = encode_batch([rec], SALT)
    assert len(frame) < MAX_RECORD_BYTES // 2 + 64 * 1024
    got = records_of(frame[RECORD_HEADER_BYTES:])
    assert not isinstance(got, str)
    assert fingerprint(rebuilt(core, got, 1)) == fingerprint(rebuilt(core, got, None))


def test_an_item_whose_backoff_is_ahead_of_the_clock_goes_through_the_one_by_one_path(
) -> None:
    """Restored at a time before the snapshot was written (a wall clock set back):
    queued items whose backoff has not passed yet wait for it, as one by one."""
    core = busy_core()
    records = [on_disk(rec) for rec in core.snapshot()]
    earlier = core.now - 35
    one, bulk = core.fresh(), core.fresh()
    for rec in records:
        one.apply(rec, earlier)
    Restore(bulk).apply(records, earlier)
    assert fingerprint(bulk) == fingerprint(one)
    assert any(not item.queued and item.state.value == "PENDING"
               for item in bulk.work.items.values())


def test_restoring_the_journal_by_frames_matches_too() -> None:
    """Journal records go through ``Core.apply`` untouched, interleaved with nothing."""
    core = busy_core()
    records = [on_disk(rec) for rec in core.records]
    assert fingerprint(rebuilt(core, records, 50)) == fingerprint(rebuilt(core, records, None))


def test_restoring_every_snapshot_record_twice_is_harmless() -> None:
    """Each record twice in a row: the state of one pass (timers armed twice, as one by
    one). The whole snapshot twice: what applying it one by one builds."""
    core = busy_core()
    records = [on_disk(rec) for rec in core.snapshot()]
    once = fingerprint(rebuilt(core, records, None))
    doubled = [rec for rec in records for _ in range(2)]
    got = fingerprint(rebuilt(core, doubled, 64))
    assert got == fingerprint(rebuilt(core, doubled, None))
    assert {k: v for k, v in got.items() if k != "wheel"} == {
        k: v for k, v in once.items() if k != "wheel"
    }
    again = records + records
    assert fingerprint(rebuilt(core, again, 64)) == fingerprint(rebuilt(core, again, None))


def test_a_restored_core_serves_its_queued_items_in_order() -> None:
    core = CoreDriver()
    for n in range(10):
        core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": n, "key": f"k{n}"})
    core.drain()
    fresh = core.fresh(holders={ALICE: "alice"})
    Restore(fresh).apply([on_disk(rec) for rec in core.snapshot()], core.now)
    got = [
        fresh.handle(core.now, ALICE, n, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
        for n in range(11)
    ]
    assert [g["delivery"]["data"] for g in got[:10]] == list(range(10))
    assert got[10]["delivery"] is None
    dup = fresh.handle(core.now, ALICE, 99, Op.TASK_SUBMIT,
                       {"scope": "s", "mailbox": "jobs", "data": 3, "key": "k3"})
    assert dup["created"] is False


@pytest.mark.parametrize("first", [0, 1, 511, 512, 513])
@pytest.mark.parametrize("more", [0, 1, 511, 512, 1500])
def test_extending_a_paged_index_is_adding_each_in_turn(first: int, more: int) -> None:
    """The bulk add restoring uses: the same blocks, sequence numbers and tail."""
    one, bulk = PagedIndex(lambda obj: True), PagedIndex(lambda obj: True)
    for n in range(first):
        one.add(n)
        bulk.add(n)
    for n in range(first, first + more):
        one.add(n)
    bulk.extend(list(range(first, first + more)))
    assert [(list(b.seqs), b.objs) for b in bulk.blocks] == [
        (list(b.seqs), b.objs) for b in one.blocks
    ]
    assert (bulk.firsts, bulk.next_seq) == (one.firsts, one.next_seq)
    assert bulk.tail_objs is bulk.blocks[-1].objs and bulk.tail_seqs is bulk.blocks[-1].seqs


@pytest.mark.parametrize("version", [3, 4])
def test_a_snapshot_file_of_format_version_3_or_4_recovers_to_the_same_state(
    tmp_path: Path, version: int,
) -> None:
    """The upgrade path: a version 3 snapshot (every item a SNAP_ITEM) and a version 4
    one (queued items in SNAP_QUEUED records) recover, through rsd's start, to the state
    applying the snapshot record by record builds."""
    core = busy_core()
    records = [on_disk(rec) for rec in core.snapshot()]
    if version == 3:
        records = as_version_3(records)
    records.append([Rec.SNAPSHOT_END, len(records)])
    salt = new_salt()
    data = file_header(SNAPSHOT_MAGIC, 7, salt, version=version) + encode_batch(records, salt)
    (tmp_path / snapshot_name(7)).write_bytes(data)
    recovered = core.fresh()
    _, report = recover(tmp_path, recovered, core.now, policy="no")
    assert report.snapshot == snapshot_name(7) and report.snapshot_records == len(records) - 1
    expected = rebuilt(core, records[:-1], None)
    expected.recovered(core.now, clean=report.clean)
    assert fingerprint(recovered) == fingerprint(expected)
    assert scan(tmp_path / snapshot_name(7), SNAPSHOT_MAGIC).version == version


def test_rsd_writes_format_version_14_and_refuses_a_newer_one(tmp_path: Path) -> None:
    salt = new_salt()
    (tmp_path / snapshot_name(1)).write_bytes(
        file_header(SNAPSHOT_MAGIC, 1, salt, version=FORMAT_VERSION + 1)
        + encode_batch([[Rec.SNAPSHOT_END, 0]], salt)
    )
    assert FORMAT_VERSION == 14
    with pytest.raises(RecoveryError, match=f"format version {FORMAT_VERSION + 1}"):
        recover(tmp_path, CoreDriver(holders={}, mailbox=None, runs=()), 0.0, policy="no")
