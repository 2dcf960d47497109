"""Recovery of the pure core: replaying records rebuilds the same state.

A hypothesis state machine drives one live Core with a fake clock through claims,
mailboxes, tasks, messages, deliveries, scope cancellation, disconnects and time, keeping
every journal record it emits (round-tripped through msgpack, as the journal stores
them). At any point it may "restart": rebuild a fresh Core (a) from every record so far
and (b) from the last snapshot's records plus the records after it, check that both
rebuilt cores hold the live core's state, and carry on with one of them, as rsd does.

Alongside: replaying records twice is harmless, and after an unclean stop that lost the
tail of the journal, no fencing token or generation that a client may have seen is ever
handed out again.
"""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from support.core import ALICE, BOB, WALL, CoreDriver, call, lease_id, on_disk

from rsd.core import DEFERRED, Core, CoreError, Rec
from rsd.core.ground import ids as ids_module
from rsd.core.restore import Restore
from rsproto import Kind, Op

RETENTION = 60.0
DEDUPE = 40.0
HOLDERS = {1: "alice", 2: "bob", 3: "carol"}
SCOPES = ["s1", "s2", "s3"]
KEYS = ["k1", "k2", "k3"]
MAILBOXES = ["jobs", "other"]


def new_core(scope_ids: Any) -> CoreDriver:
    """A core with nothing connected and no mailbox: the machine sets up the rest."""
    return CoreDriver(
        holders={},
        mailbox=None,
        scope_ids=lambda: f"made-{next(scope_ids)}",
        retention_seconds=RETENTION,
        dedupe_seconds=DEDUPE,
    )


def rebuild(records: list[Any], now: float, scope_ids: Any, frame: int = 0) -> Core:
    """A core rebuilt from ``records``: one by one, or (``frame``) restored that many
    records at a time, as rsd's start does (core/restore.py)."""
    core = new_core(scope_ids)
    if frame:
        restore = Restore(core)
        for start in range(0, len(records), frame):
            restore.apply(records[start:start + frame], now)
    else:
        for rec in records:
            core.apply(rec, now)
    assert core.effects.take_records() == [], "apply must not emit records"
    assert core.effects.take_messages() == [], "apply must not send anything"
    return core


def state_of(core: Core) -> list[str]:
    """The core's whole live state, order-independent (replay may order queues otherwise)."""
    return sorted(repr(on_disk(rec)) for rec in core.snapshot())


def without_ceilings(core: Core) -> list[str]:
    """The state but for the id ceilings (a restart reserves a new block)."""
    return sorted(repr(on_disk(rec)) for rec in core.snapshot() if rec[0] != Rec.SNAP_COUNTERS)


def counters(core: Core) -> tuple[int, int, int]:
    return core.leases.ids.top, core.work.item_ids.top, core.ids.generation_floor


def views(core: Core) -> dict[str, Any]:
    return {item_id: item.view() for item_id, item in core.work.items.items()}


class Recovery(RuleBasedStateMachine):
    """One live core, its journal, its last snapshot, and what clients were told."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.scope_ids = itertools.count(1)
        self.rids = itertools.count(1)
        self.log: list[Any] = []
        self.snapshot: list[Any] = []
        self.snapshot_at = 0  # log position the snapshot covers
        self.scopes = list(SCOPES)
        self.claims: dict[int, tuple[str, str]] = {}  # lease -> (scope, key)
        self.deliveries: set[int] = set()
        self.tasks: dict[str, str] = {}  # task id -> scope
        self.pending_acquires: dict[tuple[int, int], tuple[str, str]] = {}
        self.max_lease = 0
        self.generations: dict[tuple[str, str], int] = {}
        self.items_seen: set[str] = set()
        self.queues_used: set[tuple[str, str]] = set()
        self.restarts = 0
        self.core = new_core(self.scope_ids)
        self.core.recovered(self.now, clean=True)  # a new data directory
        self._connect_all()
        self._collect()

    # ---- plumbing --------------------------------------------------------------------

    def _connect_all(self) -> None:
        for conn, holder in HOLDERS.items():
            self.core.connected(conn, holder)

    def _collect(self) -> None:
        """Move the core's records to the journal and read what its messages told."""
        self.log.extend(on_disk(rec) for rec in self.core.effects.take_records())
        self.core.effects.take_sync()
        for conn, msg in self.core.effects.take_messages():
            if msg[0] == Kind.REPLY:
                where = self.pending_acquires.pop((conn, msg[1]), None)
                self._observe(msg[2], where)
            elif msg[0] == Kind.ERROR:
                self.pending_acquires.pop((conn, msg[1]), None)

    def _observe(self, result: Any, claim: tuple[str, str] | None = None) -> None:
        """Check what a client was told: tokens only grow, generations per key too."""
        if not isinstance(result, dict):
            return
        if claim is not None and "generation" in result:
            lease = result["lease"]
            assert lease_id(lease) > self.max_lease, "a fencing token repeated or went back"
            self.max_lease = lease_id(lease)
            assert result["generation"] > self.generations.get(claim, 0)
            self.generations[claim] = result["generation"]
            self.claims[lease] = claim
        delivery = result.get("delivery")
        if delivery:
            assert lease_id(delivery["lease"]) > self.max_lease, "a delivery token repeated"
            self.max_lease = lease_id(delivery["lease"])
            self.deliveries.add(delivery["lease"])
        if result.get("created") is True and "id" in result:
            assert result["id"] not in self.items_seen, "an item id repeated"
            self.items_seen.add(result["id"])
            self.tasks[result["id"]] = result["scope"]
        if "replay" in result and result["replay"] is False:
            assert result["id"] not in self.items_seen, "an item id repeated"
            self.items_seen.add(result["id"])

    def call(self, conn: int, op: int, args: dict[str, Any], claim: Any = None) -> Any:
        rid = next(self.rids)
        try:
            result = self.core.handle(self.now, conn, rid, op, args)
        except CoreError:
            result = None
        if result is DEFERRED:
            if claim is not None:
                self.pending_acquires[(conn, rid)] = claim
            result = None
        else:
            self._observe(result, claim)
        self._collect()
        return result

    def _scope(self, data: st.DataObject) -> str:
        """Mostly s1 (never cancelled), so that work meets workers often enough."""
        return data.draw(st.sampled_from(["s1", "s1", "s1", *self.scopes]))

    # ---- rules -----------------------------------------------------------------------

    @initialize()
    def mailboxes(self) -> None:
        self.call(1, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 3,
                                         "retry_backoff_ms": 2000})
        self.call(1, Op.MAILBOX_ENSURE, {"name": "other", "max_attempts": 1})
        for scope in SCOPES:  # runs must be created before any op names them
            self.call(1, Op.SCOPE_CREATE, {"scope": scope})

    @rule(name=st.sampled_from(MAILBOXES), attempts=st.integers(1, 4),
          backoff=st.sampled_from([0, 500, 3000]))
    def ensure(self, name: str, attempts: int, backoff: int) -> None:
        self.call(2, Op.MAILBOX_ENSURE,
                  {"name": name, "max_attempts": attempts, "retry_backoff_ms": backoff})

    @rule(conn=st.sampled_from(list(HOLDERS)), data=st.data(), key=st.sampled_from(KEYS),
          length=st.sampled_from([5, 10, 30]), wait=st.booleans(),
          timeout_ms=st.sampled_from([0, 3000, 60_000]))
    def acquire(self, conn: int, data: st.DataObject, key: str, length: int, wait: bool,
                timeout_ms: int) -> None:
        scope = self._scope(data)
        self.call(conn, Op.CLAIM_ACQUIRE,
                  {"scope": scope, "key": key, "lease_seconds": length, "wait": wait,
                   "timeout_ms": timeout_ms}, claim=(scope, key))

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), conn=st.sampled_from(list(HOLDERS)))
    def release(self, data: st.DataObject, conn: int) -> None:
        lease = data.draw(st.sampled_from(sorted(self.claims)))
        self.call(conn, Op.CLAIM_RELEASE, {"lease": lease})

    @precondition(lambda self: self.claims or self.deliveries)
    @rule(data=st.data(), resize=st.sampled_from([None, None, 5, 20]))
    def renew(self, data: st.DataObject, resize: int | None) -> None:
        leases = data.draw(st.lists(st.sampled_from(sorted(set(self.claims) | self.deliveries)),
                                    min_size=1, max_size=3))
        items = [lease if resize is None else [lease, resize] for lease in leases]
        self.call(1, Op.LEASE_RENEW, {"leases": items})

    @rule(data=st.data(), mailbox=st.sampled_from(["jobs", "jobs", "other"]),
          key=st.sampled_from([None, "t1", "t2", "t3"]), payload=st.integers(0, 2),
          deadline=st.sampled_from([None, None, 20.0, 200.0]),
          subscriber=st.sampled_from([None, "sub-a"]))
    def submit(self, data: st.DataObject, mailbox: str, key: str | None, payload: int,
               deadline: float | None, subscriber: str | None) -> None:
        scope = self._scope(data)
        args: dict[str, Any] = {"scope": scope, "mailbox": mailbox, "data": {"n": payload}}
        if key is not None:
            args["key"] = key
        if deadline is not None:
            args["deadline"] = WALL + self.now + deadline
        if subscriber is not None:
            args["subscriber_id"] = subscriber
        self.queues_used.add((scope, mailbox))
        self.call(3, Op.TASK_SUBMIT, args)

    @rule(data=st.data(), work_key=st.sampled_from([None, "w1", "w2"]),
          payload=st.binary(max_size=4))
    def send(self, data: st.DataObject, work_key: str | None, payload: bytes) -> None:
        scope = self._scope(data)
        self.queues_used.add((scope, "jobs"))
        self.call(3, Op.MESSAGE_SEND,
                  {"scope": scope, "mailbox": "jobs", "data": payload, "work_key": work_key})

    @rule(conn=st.sampled_from(list(HOLDERS)), data=st.data(), wait=st.booleans(),
          length=st.sampled_from([5, 30]))
    def receive(self, conn: int, data: st.DataObject, wait: bool, length: int) -> None:
        """Mostly from a queue that was given work, else from anywhere (and maybe park)."""
        choices = [*sorted(self.queues_used)] * 3 + [("s1", "jobs"), ("s2", "other")]
        scope, mailbox = data.draw(st.sampled_from(choices))
        self.call(conn, Op.RECEIVE, {"scope": scope, "mailbox": mailbox, "wait": wait,
                                     "timeout_ms": 10_000, "lease_seconds": length})

    @precondition(lambda self: self.deliveries)
    @rule(data=st.data(), how=st.sampled_from(["complete", "retry", "retry0", "release",
                                               "reject", "suspend"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        lease = data.draw(st.sampled_from(sorted(self.deliveries)))
        if how == "complete":
            self.call(1, Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": {"by": lease}})
        elif how == "retry":
            self.call(1, Op.DELIVERY_RETRY, {"lease": lease, "reason": "flaky"})
        elif how == "retry0":
            self.call(1, Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 0})
        elif how == "release":
            self.call(1, Op.DELIVERY_RELEASE, {"lease": lease})
        elif how == "suspend":
            self.call(1, Op.DELIVERY_SUSPEND, {
                "lease": lease, "name": data.draw(st.sampled_from(["a", "b"])),
                "timeout_seconds": data.draw(st.sampled_from([0, 3, 40])),
            })
        else:
            self.call(1, Op.DELIVERY_REJECT, {"lease": lease, "reason": "bad input"})

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), what=st.sampled_from(["cancel", "result", "join", "detach",
                                                "signal"]))
    def ticket(self, data: st.DataObject, what: str) -> None:
        task = data.draw(st.sampled_from(sorted(self.tasks)))
        args = {"scope": self.tasks[task], "task": task}
        if what == "cancel":
            self.call(2, Op.TASK_CANCEL, {**args, "reason": "no longer needed"})
        elif what == "result":
            self.call(2, Op.TASK_RESULT, {**args, "timeout_ms": 5000})
        elif what == "signal":
            self.call(2, Op.TASK_SIGNAL, {**args, "name": data.draw(st.sampled_from(["a", "b"])),
                                          "data": {"by": "bob"}})
        elif what == "join":
            self.call(2, Op.TASK_JOIN, {**args, "subscriber_id": "sub-b",
                                        "subscriber_scope": "s1"})
        else:
            self.call(2, Op.TASK_DETACH, {**args, "subscriber_id": "sub-a"})

    @precondition(lambda self: len(self.scopes) < 5)
    @rule()
    def create_scope(self) -> None:
        reply = self.call(1, Op.SCOPE_CREATE, {})
        self.scopes.append(reply["scope"])

    @rule(data=st.data())
    def cancel_scope(self, data: st.DataObject) -> None:
        scope = data.draw(st.sampled_from(self.scopes[1:]))  # s1 lives on: keeps work going
        self.call(1, Op.SCOPE_CANCEL, {"scope": scope, "reason": "stop"})

    @rule(conn=st.sampled_from(list(HOLDERS)))
    def reconnect(self, conn: int) -> None:
        """A connection drops (its waits die, its leases do not) and comes back."""
        self.core.disconnected(conn)
        self.pending_acquires = {k: v for k, v in self.pending_acquires.items() if k[0] != conn}
        self.core.connected(conn, HOLDERS[conn])
        self._collect()

    @rule(seconds=st.sampled_from([0.004, 0.5, 2.0, 4.0, 6.0, 11.0, 31.0, 45.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.core.tick(self.now)
        self._collect()

    @rule()
    def take_snapshot(self) -> None:
        self.snapshot = [on_disk(rec) for rec in self.core.snapshot()]
        self.snapshot_at = len(self.log)

    @rule(from_snapshot=st.booleans(), clean=st.booleans())
    def restart(self, from_snapshot: bool, clean: bool) -> None:
        """Rebuild from the journal and from snapshot + journal; carry on with one.

        ``clean=False`` is a crash that lost nothing (``--fsync always``): the counters
        and every generation must jump, and the checks in ``_observe`` then prove that no
        later grant repeats a token or a generation."""
        live = self.core
        live.tick(self.now)  # the server ticks before every batch: nothing due is pending
        self._collect()
        from_log = rebuild(self.log, self.now, self.scope_ids)
        from_snap = rebuild(self.snapshot + self.log[self.snapshot_at:], self.now,
                            self.scope_ids, frame=5)
        expected = state_of(live)
        for rebuilt in (from_log, from_snap):
            assert state_of(rebuilt) == expected
            assert views(rebuilt) == views(live)
            assert counters(rebuilt) == counters(live)
            assert sorted(x.handle for x in rebuilt.leases.all()) == sorted(
                x.handle for x in live.leases.all()
            )
        core = from_snap if from_snapshot else from_log
        before = counters(core)
        core.recovered(self.now, clean=clean)
        assert core.ids.lease_ceiling >= live.ids.lease_ceiling
        assert core.ids.item_ceiling >= live.ids.item_ceiling
        if clean:
            assert counters(core) == before, "a clean restart must not jump anything"
            assert without_ceilings(core) == without_ceilings(live)
        else:
            assert core.leases.ids.top > before[0] and core.ids.generation_floor > before[2]
            for scope in live.scopes.values():
                for key, claim in scope.claims.items():
                    held = core.scopes[scope.key].claims[key]
                    assert held.generation == claim.generation  # its holder's, kept
                    assert core.claims.next_generation(held) > claim.generation + 1
        self.core = core
        self.pending_acquires.clear()  # waits die with the old process
        self.restarts += 1
        self._connect_all()
        self._collect()

    # ---- invariants ------------------------------------------------------------------

    @invariant()
    def replies_never_reveal_unreserved_ids(self) -> None:
        """Every id a client saw lies below the reserved (journaled) ceiling."""
        assert self.max_lease < self.core.ids.lease_ceiling
        assert self.core.leases.ids.top <= self.core.ids.lease_ceiling
        assert self.core.work.item_ids.top <= self.core.ids.item_ceiling


Recovery.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRecovery = Recovery.TestCase


# ---- plain tests ---------------------------------------------------------------------------


def scripted_core() -> tuple[Core, list[Any], float]:
    """A core put through every kind of record; returns it, its journal and the time."""
    rids = itertools.count(1)
    core = new_core(itertools.count(1))
    core.recovered(0.0, clean=True)
    for conn, holder in HOLDERS.items():
        core.connected(conn, holder)
    log: list[Any] = []

    def call(now: float, op: int, args: dict[str, Any], conn: int = 1) -> Any:
        try:
            return core.handle(now, conn, next(rids), op, args)
        finally:
            log.extend(on_disk(rec) for rec in core.effects.take_records())
            core.effects.take_messages()

    def tick(now: float) -> None:
        core.tick(now)
        log.extend(on_disk(rec) for rec in core.effects.take_records())
        core.effects.take_messages()

    log.extend(on_disk(rec) for rec in core.effects.take_records())
    call(0.0, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 2, "retry_backoff_ms": 0})
    call(0.0, Op.SCOPE_CREATE, {"scope": "s"})
    scope = call(0.0, Op.SCOPE_CREATE, {})["scope"]
    held = call(0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "a", "lease_seconds": 5})
    call(0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "a", "wait": True}, conn=2)
    call(1.0, Op.CLAIM_RELEASE, {"lease": held["lease"]})  # granted to bob's wait
    call(1.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "b", "lease_seconds": 5})  # expires
    call(1.0, Op.CLAIM_ACQUIRE, {"scope": scope, "key": "c", "lease_seconds": 30})
    for n in range(6):
        call(2.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": f"t{n}",
                                   "data": n, "subscriber_id": "x"})
    call(2.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": b"m",
                                "work_key": "w"})
    deliveries = [
        call(3.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 5})["delivery"]
        for _ in range(6)
    ]
    call(3.0, Op.DELIVERY_COMPLETE, {"lease": deliveries[0]["lease"], "outcome": {"ok": 1}})
    call(3.0, Op.DELIVERY_RETRY, {"lease": deliveries[1]["lease"], "delay_ms": 0})
    call(3.0, Op.DELIVERY_REJECT, {"lease": deliveries[2]["lease"], "reason": "no"})
    call(3.0, Op.DELIVERY_RELEASE, {"lease": deliveries[3]["lease"]})
    call(3.0, Op.TASK_DETACH, {"scope": "s", "task": deliveries[4]["id"], "subscriber_id": "x"})
    call(3.0, Op.TASK_CANCEL, {"scope": "s", "task": deliveries[4]["id"]})
    tick(12.0)  # claim b and the last delivery expire; the retried task is ready again
    again = call(12.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 30})
    assert again["delivery"] is not None
    call(12.0, Op.SCOPE_CANCEL, {"scope": scope})
    tick(50.0)  # dedupe window ends
    tick(80.0)  # retention ends: tombstones
    kinds = {rec[0] for rec in log}
    for kind in (Rec.CLAIM_GRANTED, Rec.LEASE_ENDED, Rec.SCOPE_CREATED, Rec.SCOPE_CANCELLED,
                 Rec.MAILBOX_ENSURED, Rec.ITEM_ENQUEUED, Rec.DELIVERED, Rec.REQUEUED,
                 Rec.FINISHED, Rec.SUBSCRIBED, Rec.DETACHED, Rec.TOMBSTONED,
                 Rec.DEDUPE_EXPIRED, Rec.IDS_RESERVED):
        assert kind in kinds, f"the script should produce a {kind.name} record"
    return core, log, 80.0


def test_rebuilding_from_the_journal_and_from_a_snapshot_gives_the_same_state() -> None:
    core, log, now = scripted_core()
    assert state_of(rebuild(log, now, itertools.count(1))) == state_of(core)
    snap = [on_disk(rec) for rec in core.snapshot()]
    assert state_of(rebuild(snap, now, itertools.count(1))) == state_of(core)


def test_applying_every_record_twice_in_a_row_is_harmless() -> None:
    core, log, now = scripted_core()
    twice = [rec for rec in log for _ in range(2)]
    assert state_of(rebuild(twice, now, itertools.count(1))) == state_of(core)


def test_applying_every_snapshot_record_twice_in_a_row_is_harmless() -> None:
    core, _, now = scripted_core()
    snap = [on_disk(rec) for rec in core.snapshot()]
    twice = [rec for rec in snap for _ in range(2)]
    assert state_of(rebuild(twice, now, itertools.count(1))) == state_of(core)


def test_a_snapshot_followed_by_the_journal_it_covers_is_harmless() -> None:
    """The journal replayed again over a snapshot that already holds its effects."""
    core, log, now = scripted_core()
    snap = [on_disk(rec) for rec in core.snapshot()]
    assert state_of(rebuild(snap + log, now, itertools.count(1))) == state_of(core)


def test_replaying_the_whole_journal_twice_is_harmless() -> None:
    core, log, now = scripted_core()
    assert state_of(rebuild(log + log, now, itertools.count(1))) == state_of(core)


def _grant(core: Core, now: float, scope: str, key: str, rid: int) -> dict[str, Any]:
    reply = core.handle(now, 1, rid, Op.CLAIM_ACQUIRE,
                        {"scope": scope, "key": key, "lease_seconds": 5})
    assert reply is not DEFERRED
    return reply


def test_clean_restart_keeps_generations_and_tokens_exactly() -> None:
    core, log, now = scripted_core()
    rebuilt = rebuild(log, now, itertools.count(1))
    rebuilt.recovered(now, clean=True)
    assert counters(rebuilt) == counters(core)
    rebuilt.connected(1, "alice")
    core.connected(1, "alice")
    # The same lease id and generation; the random part of a handle is drawn per grant.
    again, live = _grant(rebuilt, now, "s", "b", 1), _grant(core, now, "s", "b", 1)
    assert lease_id(again.pop("lease")) == lease_id(live.pop("lease"))
    assert again == live


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["grant", "release", "deliver"]), st.sampled_from(KEYS)),
        min_size=1, max_size=120,
    ),
    cut=st.floats(0.0, 1.0),
)
def test_after_an_unclean_stop_no_token_or_generation_a_client_saw_repeats(
    ops: list[tuple[str, str]], cut: float
) -> None:
    """A crash loses the tail of the journal (under everysec or no). Whatever it lost, a
    client may have seen every id below the last durable reservation; after recovery
    every new grant's token and generation must lie above all of them."""
    with mock.patch.object(ids_module, "BLOCK", 16), mock.patch.object(ids_module, "_MARGIN", 4):
        rids = itertools.count(1)
        core = new_core(itertools.count(1))
        core.recovered(0.0, clean=True)
        core.connected(1, "alice")
        log = [on_disk(rec) for rec in core.effects.take_records()]
        core.handle(0.0, 1, next(rids), Op.MAILBOX_ENSURE, {"name": "jobs"})
        core.handle(0.0, 1, next(rids), Op.SCOPE_CREATE, {"scope": "s"})
        held: dict[str, bytes] = {}
        seen: list[tuple[str, int, int]] = []  # (key, lease id, generation) told to clients
        for what, key in ops:
            if what == "grant" and key not in held:
                reply = _grant(core, 0.0, "s", key, next(rids))
                held[key] = reply["lease"]
                seen.append((key, lease_id(reply["lease"]), reply["generation"]))
            elif what == "release" and key in held:
                core.handle(0.0, 1, next(rids), Op.CLAIM_RELEASE, {"lease": held.pop(key)})
            elif what == "deliver":
                core.handle(0.0, 1, next(rids), Op.TASK_SUBMIT,
                            {"scope": "s", "mailbox": "jobs", "data": key})
                core.handle(0.0, 1, next(rids), Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
            log.extend(on_disk(rec) for rec in core.effects.take_records())
        kept = log[: int(len(log) * cut)]
        durable_ceiling = max(rec[1] for rec in kept if rec[0] == Rec.IDS_RESERVED) if any(
            rec[0] == Rec.IDS_RESERVED for rec in kept) else ids_module.BLOCK + 1
        # Ids at or above the durable ceiling cannot have been shown: the batch that
        # reserved them is fsynced before its replies leave.
        visible = [s for s in seen if s[1] < durable_ceiling]
        after = rebuild(kept, 1.0, itertools.count(1))
        before_jump = after.ids.generation_floor
        after.recovered(1.0, clean=False)
        assert after.ids.generation_floor >= before_jump
        after.connected(1, "alice")
        after.handle(1.0, 1, next(rids), Op.SCOPE_CREATE, {"scope": "s"})  # if it was lost
        max_lease = max([lease for _, lease, _ in visible], default=0)
        for key in KEYS:
            scope = after.scopes.get(("default", "s"))
            claim = scope.claims.get(key) if scope is not None else None
            if claim is not None and claim.lease is not None:
                after.handle(
                    1.0, 1, next(rids), Op.CLAIM_RELEASE, {"lease": claim.lease.handle}
                )
            reply = _grant(after, 1.0, "s", key, next(rids))
            assert lease_id(reply["lease"]) > max_lease, "a fencing token repeated after a crash"
            for seen_key, _, generation in visible:
                if seen_key == key:
                    assert reply["generation"] > generation, "a generation went back"
            max_lease = lease_id(reply["lease"])


def test_unclean_restart_jumps_every_generation_and_the_next_lease() -> None:
    core, log, now = scripted_core()
    before = {
        (scope.id, key): claim.generation
        for scope in core.scopes.values()
        for key, claim in scope.claims.items()
    }
    next_lease = core.leases.ids.top
    rebuilt = rebuild(log, now, itertools.count(1))
    rebuilt.recovered(now, clean=False)
    assert rebuilt.leases.ids.top > next_lease
    assert rebuilt.ids.generation_floor > core.ids.generation_floor
    for (scope, key), generation in before.items():  # held through it: the holder's kept
        claim = rebuilt.scopes[scope].claims[key]
        assert claim.generation == generation
        assert rebuilt.claims.next_generation(claim) > generation + 1
    # and a second crash right after jumps again, never back
    records = log + [on_disk(rec) for rec in rebuilt.effects.take_records()]
    again = rebuild(records, now, itertools.count(1))
    assert counters(again) == counters(rebuilt)
    again.recovered(now, clean=False)
    assert again.leases.ids.top > rebuilt.leases.ids.top
    for (scope, key), _ in before.items():
        assert (again.claims.next_generation(again.scopes[scope].claims[key])
                > rebuilt.claims.next_generation(rebuilt.scopes[scope].claims[key]))


@pytest.mark.parametrize("clean", [True, False])
def test_recovery_reservation_is_journaled_and_asks_for_an_fsync(clean: bool) -> None:
    _, log, now = scripted_core()
    rebuilt = rebuild(log, now, itertools.count(1))
    rebuilt.recovered(now, clean=clean)
    records = rebuilt.effects.take_records()
    assert rebuilt.effects.take_sync() is True
    assert records[-1][0] == Rec.IDS_RESERVED
    assert (Rec.IDS_JUMPED in {rec[0] for rec in records}) is not clean


def test_replay_and_snapshot_agree_after_expiry_on_the_last_attempt_and_forgetting() -> None:
    """Last-attempt expiry (dead letter), keyed message dedupe, a resized delivery lease,
    a scope cancel with a parked consumer and a task result wait, then retention and
    forgetting: the journal and snapshot+journal rebuild what the live core holds."""
    core = CoreDriver(recovered=True, retention_seconds=10, tombstone_seconds=10, dedupe_seconds=5,
                      runs=())
    log: list[Any] = []

    def step(now: float, op: int, args: dict[str, Any], conn: int = ALICE) -> Any:
        result = call(core, now, op, args, conn)
        log.extend(core.effects.take_records())
        core.effects.take_messages()
        return result

    def tick(now: float) -> None:
        core.tick(now)
        log.extend(core.effects.take_records())
        core.effects.take_messages()

    step(0.0, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 1})
    step(0.0, Op.SCOPE_CREATE, {"scope": "s"})
    step(0.0, Op.SCOPE_CREATE, {"scope": "c"})
    task = step(0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": "k", "data": 1})
    step(0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": 2, "work_key": "w"})
    first = step(0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 5})
    step(0.0, Op.LEASE_RENEW, {"leases": [[first["delivery"]["lease"], 7]]})
    step(0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 5})
    assert step(0.0, Op.TASK_RESULT, {"scope": "s", "task": task["id"]}, BOB) is DEFERRED
    assert step(0.0, Op.RECEIVE, {"scope": "c", "mailbox": "jobs", "wait": True}) is DEFERRED
    step(0.0, Op.SCOPE_CANCEL, {"scope": "c"})
    snapshot = list(core.snapshot())
    mark = len(log)
    tick(8.0)  # both deliveries expire on their last attempt: dead letters; dedupe ends
    tick(19.0)  # retention: tombstone
    mid = list(core.snapshot())
    tick(30.0)  # forgotten
    assert core.work.items == {}
    for rebuilt in (core.replay(log, 30.0), core.replay(snapshot + log[mark:], 30.0)):
        rebuilt.tick(30.0)
        assert state_of(rebuilt) == state_of(core)
    assert state_of(core.replay(mid, 19.0)) != state_of(core)  # sanity: state did move
