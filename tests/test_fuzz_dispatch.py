"""The dispatcher under hostile input: the core, then a real rsd, fed every op code (valid
and not), args of every wrong type and size, ops out of order, on many connections, with
reconnects, restarts and time passing.

What must hold, in the core (on the fake clock of tests/support/core.py):
- every request is answered (a reply msgpack can carry) or refused with a CoreError whose
  code protocol.md documents for requests; never another exception, never INTERNAL;
- a request the core defers is answered later: by the time the longest wait has run out,
  every deferred request of a connection still open has its reply or error;
- every record the core emits survives the journal's msgpack round trip, and replaying
  the journal into a fresh core (recovery) rebuilds the live state exactly, as does the
  core's snapshot: the snapshot records compared one by one;

and against a real rsd (tests/support/process.py, raw sockets of tests/support/raw.py):
- random and damaged frames on many connections at once, HELLO args (``token`` of every
  type included) fuzzed too: rsd stays up, logs no traceback, keeps answering a
  bystander's PING; every connection either gets an answer to each request or ends
  with a connection-level error frame of a documented code;
- after a kill -9 and a restart, the data directory recovers to the state acknowledged
  before the kill.

The server pass takes an optional token (``AUTH``): with authentication, the same pass
runs with rsd started on a tokens file and HELLO carrying the token.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import msgpack
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from support import fuzz
from support.core import CoreDriver, on_disk
from support.fuzz import TALLY, Known
from support.fuzz_client import Bystander, fuzz_server
from support.process import KILLED

from rsd.core import DEFERRED, CoreError
from rsd.security.tokens import hash_token, new_token
from rsproto import Kind, Op, pack_body

REQUEST_CODES = fuzz.documented_codes("request") - {"INTERNAL"}
LONGEST_WAIT = 3601.0  # seconds: past MAX_WAIT_TIMEOUT_MS, every wait has ended
HOLDER_NAMES = ["alice", "bob", "carol", "dave", "x" * 256, "é"]


def state_of(core: CoreDriver) -> list[str]:
    """The core's whole live state as its snapshot records, order-independent."""
    return sorted(repr(on_disk(rec)) for rec in core.snapshot())


class CoreFuzz:
    """One core, its connections, what it was told, and the requests it still owes."""

    def __init__(self) -> None:
        self.core = CoreDriver(holders={}, mailbox=None, recovered=True)
        self.known = Known()
        self.conns: dict[int, str] = {}
        self.next_conn = itertools.count(1)
        self.rids = itertools.count(1)
        self.owed: set[tuple[int, int]] = set()  # deferred (conn, request id)
        self.restarts = 0

    # ---- the shell's calls -------------------------------------------------------------

    def connect(self, holder: str) -> int:
        conn = next(self.next_conn)  # the server never reuses a connection id
        self.core.connected(conn, holder)
        self.conns[conn] = holder
        TALLY.connections += 1
        return conn

    def disconnect(self, conn: int) -> None:
        self.core.disconnected(conn)
        del self.conns[conn]
        self.owed = {owed for owed in self.owed if owed[0] != conn}
        self._drain()

    def send(self, conn: int, op: int, args: dict[Any, Any]) -> Any:
        """One request, as the server makes it after HELLO: an int op, a map of args."""
        rid = next(self.rids)
        TALLY.inputs += 1
        try:
            result = self.core.handle(self.core.now, conn, rid, op, args)
        except CoreError as exc:
            self._refused(exc.code, exc.message, exc.details)
            result = None
        except Exception:
            TALLY.unhandled += 1
            raise
        else:
            if result is DEFERRED:
                self.owed.add((conn, rid))
                fuzz._remember(self.known.rids, rid)
            else:
                pack_body([int(Kind.REPLY), rid, result])  # the server must be able to send it
                TALLY.answered += 1
                self.known.learn(result)
        self._drain()
        return result

    def tick(self, seconds: float) -> None:
        self.core.now += seconds
        self._tick()

    def _tick(self) -> None:
        """Fire everything due (the core fires at most 64 rounds per call)."""
        core = self.core
        for _ in range(100):
            core.tick(core.now)
            self._drain()
            deadline = core.next_deadline()
            if deadline is None or deadline > core.now:
                return
        raise AssertionError("timers still due after 100 ticks")

    # ---- what must hold ----------------------------------------------------------------

    def _refused(self, code: Any, message: Any, details: Any) -> None:
        assert code in REQUEST_CODES, f"refused with {code!r}, not a documented request code"
        assert isinstance(message, str) and message, "a refusal must say why"
        msgpack.packb(details, use_bin_type=True)
        TALLY.refusals[str(code)] += 1

    def _drain(self) -> None:
        """Take what the core emitted: its records must survive the journal, its messages
        must be sendable, and they settle what it owed."""
        start = len(self.core.records)
        # SNAPSHOT_NOW is answered by the shell once it has written a snapshot
        # (snapshots.py), never by the core: settled here as the shell would settle it.
        for asked in self.core.effects.snapshot_asks:
            self.owed.discard(asked)
        self.core.effects.snapshot_asks.clear()
        for conn, msg in self.core.drain():
            pack_body(msg)
            if msg[0] == Kind.REPLY:
                TALLY.answered += (conn, msg[1]) in self.owed
                self.owed.discard((conn, msg[1]))
                self.known.learn(msg[2])
            elif msg[0] == Kind.ERROR:
                self.owed.discard((conn, msg[1]))
                self._refused(msg[2], msg[3], msg[4])
        for rec in self.core.records[start:]:
            on_disk(rec)  # the journal can write it (the replay checks what it means)

    def check_journal(self) -> None:
        """Replay and snapshot both rebuild the live state (the recovery paths)."""
        self._tick()
        live = self.core
        expected = state_of(live)
        # Each rebuilt core as a recovered server serves it: after its first tick at the
        # same instant, which fires what was due by then as the live core's ticks did (a
        # rate key's gate idle past its period is dropped by its timer, with no record:
        # keylimits.py; rebuilt, it waits for that tick).
        rebuilt = live.replay()
        rebuilt.now = live.now
        rebuilt.advance(0)
        assert state_of(rebuilt) == expected, "the journal does not rebuild the state"
        snapshot = [on_disk(rec) for rec in live.snapshot()]
        from_snapshot = live.replay(snapshot)
        from_snapshot.now = live.now
        from_snapshot.advance(0)
        assert state_of(from_snapshot) == expected, "the snapshot does not rebuild the state"

    def restart(self) -> None:
        """Recover from the journal as rsd does; every connection is gone."""
        self.check_journal()
        rebuilt = self.core.replay()
        rebuilt.records = list(self.core.records)
        rebuilt.now = self.core.now
        self.core = rebuilt
        rebuilt.recovered(rebuilt.now, clean=self.restarts % 2 == 0)
        self.restarts += 1
        holders = list(self.conns.values())
        self.conns.clear()
        self.owed.clear()
        self._drain()
        for holder in holders:
            self.connect(holder)

    def settle(self) -> None:
        """Let every wait run out: nothing may still be owed to an open connection."""
        self.tick(LONGEST_WAIT)
        assert not self.owed, f"deferred requests never answered: {sorted(self.owed)[:5]}"


# ---- random op sequences, a seed each ------------------------------------------------------

STEPS = 4000


def run_sequence(seed: int, steps: int) -> CoreFuzz:
    rng = random.Random(seed)
    run = CoreFuzz()
    for _ in range(3):
        run.connect(rng.choice(HOLDER_NAMES))
    for name in run.known.mailboxes:  # most requests then reach the rules past NOT_FOUND
        run.send(1, Op.MAILBOX_ENSURE, {"name": name, "max_attempts": 2})
    for step in range(steps):
        roll = rng.random()
        if roll < 0.86 and run.conns:
            op, args = fuzz.request(rng, run.known)
            run.send(rng.choice(list(run.conns)), op, args)
        elif roll < 0.90 and run.owed:
            conn, rid = rng.choice(sorted(run.owed))
            run.send(conn, Op.CANCEL, {"request": rid})
        elif roll < 0.93:
            if len(run.conns) < 32:
                run.connect(rng.choice(HOLDER_NAMES))
        elif roll < 0.95 and run.conns:
            run.disconnect(rng.choice(list(run.conns)))
        elif roll < 0.995:
            run.tick(rng.choice([0.0, 0.001, 0.2, 1.0, 4.9, 5.0, 31.0, 601.0]))
        else:
            run.restart()
        if step % 500 == 499:
            run.check_journal()
    run.check_journal()
    run.settle()
    run.check_journal()
    return run


@pytest.mark.parametrize("seed", range(4))
def test_random_op_sequences_are_answered_or_refused_and_the_journal_rebuilds_them(
    seed: int,
) -> None:
    run = run_sequence(seed * 7919 + fuzz.SCALE, STEPS * fuzz.SCALE)
    assert len(run.core.records) > 10, "the sequence should have changed state"


# ---- the same, as a hypothesis state machine (shrinks a failure to its few steps) ---------


class Dispatch(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run = CoreFuzz()
        self.run.connect("alice")
        self.run.send(1, Op.MAILBOX_ENSURE, {"name": "jobs"})

    @rule(holder=st.sampled_from(HOLDER_NAMES))
    def connect(self, holder: str) -> None:
        self.run.connect(holder)

    @precondition(lambda self: len(self.run.conns) > 1)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        self.run.disconnect(data.draw(st.sampled_from(sorted(self.run.conns))))

    @rule(data=st.data(), op=st.sampled_from(fuzz.OPS * 3 + fuzz.BAD_OPS),
          seed=st.integers(0, 2**32))
    def send(self, data: st.DataObject, op: int, seed: int) -> None:
        rng = random.Random(seed)
        _, args = fuzz.request(rng, self.run.known)  # args drawn for another op at times
        if rng.random() < 0.7:
            args = {name: fuzz.field_value(rng, name, self.run.known)
                    for name in fuzz.FIELDS.get(op, ()) if rng.random() < 0.95}
        self.run.send(data.draw(st.sampled_from(sorted(self.run.conns))), op, args)

    @precondition(lambda self: self.run.owed)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        conn, rid = data.draw(st.sampled_from(sorted(self.run.owed)))
        self.run.send(conn, Op.CANCEL, {"request": rid})

    @rule(seconds=st.sampled_from([0.0, 0.001, 1.0, 5.0, 31.0, 601.0]))
    def tick(self, seconds: float) -> None:
        self.run.tick(seconds)

    @rule()
    def restart(self) -> None:
        self.run.restart()

    def teardown(self) -> None:
        self.run.check_journal()
        self.run.settle()


Dispatch.TestCase.settings = fuzz.fuzz_settings(60, stateful_step_count=40)
TestDispatchStateMachine = Dispatch.TestCase


# ---- a real rsd -------------------------------------------------------------------------------

SERVER_CONNECTIONS = 64
SERVER_FRAMES = 40
STABLE = ("items", "mailboxes")  # core figures no clock moves: a restart must keep them


def auth_setup(auth: str | None, server: Any) -> tuple[list[str], str | None]:
    """rsd's extra arguments and the token HELLO carries, per authentication mode. None:
    no tokens file (every loopback connection is served). "tokens": a tokens file with
    one admin token (the bystander reads SERVER_STATS), carried by every HELLO the pass
    sends; the HELLOs it fuzzes carry tokens of every type and are refused."""
    if auth is None:
        return [], None
    if auth == "tokens":
        token = new_token()
        path = server.write_tokens(f"{hash_token(token)} fuzz admin")
        return ["--tokens-file", str(path)], token
    raise AssertionError(f"unknown authentication mode {auth!r}")


@pytest.mark.parametrize("auth", [None, "tokens"])
async def test_rsd_serves_or_refuses_every_hostile_connection_and_recovers_after_kill(
    rsds: Any, raw_connect: Any, auth: str | None,
) -> None:
    server = rsds("fuzz")
    extra, token = auth_setup(auth, server)
    await server.start("--frame-timeout", "1", *extra)
    hello = {"version": 1, "holder": "bystander", **({} if token is None else {"token": token})}
    by = await raw_connect(server.address)
    await by.ok(Op.HELLO, hello)
    await by.ok(Op.MAILBOX_ENSURE, {"name": "by"})
    await by.ok(Op.SCOPE_CREATE, {"scope": "by"})  # runs must exist
    claim = await by.ok(Op.CLAIM_ACQUIRE, {"scope": "by", "key": "k", "lease_seconds": 600})
    task = await by.ok(Op.TASK_SUBMIT, {"scope": "by", "mailbox": "by", "key": "t", "data": 1})
    bystander = Bystander(by)
    bystander.start()
    tally = fuzz.Tally()
    problems = await fuzz_server(server.address, fuzz.SCALE, tally,
                                 connections=SERVER_CONNECTIONS * fuzz.SCALE,
                                 frames=SERVER_FRAMES, token=token)
    await bystander.stop()
    TALLY.add(tally)
    assert not problems, "\n".join(problems[:20])
    assert bystander.problem is None, bystander.problem
    assert bystander.latencies, "the bystander was never answered"
    assert tally.unhandled == 0
    assert server.alive, f"rsd exited; log:\n{server.log()}"
    assert not server.tracebacks()
    before = await acknowledged(by, task["id"])

    assert await server.kill() == KILLED
    await server.start("--frame-timeout", "1", *extra)
    again = await raw_connect(server.address)
    await again.ok(Op.HELLO, hello)
    after = await acknowledged(again, task["id"])
    assert after["core"] == before["core"]
    assert after["task"] == before["task"]
    # a fuzzer may have ended the claim with a guessed lease id (small integers today);
    # whatever it was at the kill, it is after the restart, and never goes back
    assert after["claim"]["held"] == before["claim"]["held"]
    assert after["claim"]["generation"] >= before["claim"]["generation"] >= claim["generation"]


async def acknowledged(conn: Any, task: str) -> dict[str, Any]:
    """What rsd acknowledged: the core figures no clock moves, the bystander's claim and
    task (no fuzzer names the task: its scope and mailbox are the bystander's own)."""
    stats = await conn.ok(Op.SERVER_STATS, {})
    status = await conn.ok(Op.TASK_STATUS, {"scope": "by", "task": task})
    return {
        "core": {key: stats["core"][key] for key in STABLE},
        "claim": await conn.ok(Op.CLAIM_INSPECT, {"scope": "by", "key": "k"}),
        "task": {key: status[key] for key in ("id", "state")},
    }
