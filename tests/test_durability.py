"""Durability against real rsd processes: crashes, torn and damaged files, failing disks,
and restarts under live leases.

- The kill -9 loop: several data directories at once, each started and crashed over and
  over (SIGKILL at a random moment, or a failpoint: before a write, before or after an
  fsync, in the middle of a snapshot, after a snapshot's rename), under load. Every change
  a client saw acknowledged must be there after each restart, and no fencing token,
  generation or task id may ever repeat or go back. Most cycles run ``--fsync always``;
  one directory alternates ``everysec`` and ``no``, where a crash of the machine may lose
  changes, but a crash of rsd alone (all a test can do) loses nothing that was replied
  to under any policy (protocol.md, "Durability"), so the same checks apply.
- A torn tail of the last segment is cut off with a warning; damage in the middle refuses
  to start (exit 2) unless ``--repair``.
- A failing write (ENOSPC) or fsync (EIO) ends rsd with exit code 74 before anything
  depending on it is acknowledged.
- After a restart, leases that were live get one full lease to be renewed: a holder that
  reconnects keeps them; an orphan expires about one lease after the restart (a short
  lease: ``SHORT_LEASES``, support/process.py). A clean
  restart keeps generations exactly; an unclean one may jump them, never back. Deadlines
  and windows that passed while rsd was down take effect when it starts.

Servers (``rsds``, see support/process.py) are awaited, so that many run at once; a
restart reuses the data directory, and the port when a client must find the server again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers.loadgen import Ledger, run_load
from support.aio import close_quietly
from support.process import HELPERS, KILLED, SHORT_LEASE, SHORT_LEASES, Rsd, subprocess_env

from rsclient import AsyncRunstate, ConflictError, NotFoundError, UnavailableError
from rsd.core import Rec
from rsd.disk import logfile_v1
from rsd.disk.logfile import (
    HEADER_BYTES,
    JOURNAL_MAGIC,
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    encode_record,
    new_salt,
    scan,
)


def records_end(path: Path) -> int:
    """Where an intact file's records end: its size, less the zeros the journal writes
    ahead of its records (preallocation, cut off at a clean stop, left by a kill)."""
    data = path.read_bytes()
    pos = HEADER_BYTES
    while pos + RECORD_HEADER_BYTES <= len(data) and data[pos : pos + 8] != bytes(8):
        pos += RECORD_HEADER_BYTES + struct.unpack_from(">I", data, pos + 8)[0]
    assert data.count(0, pos) == len(data) - pos  # what follows is zeros only
    return pos


def frames(path: Path) -> list[tuple[int, list[Any]]]:
    """Each frame of an intact file: its offset and the records it holds (one write of
    the journal is one frame, a batch of records); the zeros written ahead end it."""
    data = path.read_bytes()[: records_end(path)]
    found, pos, head = [], HEADER_BYTES, RECORD_HEADER_BYTES
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos + 8)
        value = msgpack.unpackb(data[pos + head : pos + head + size], raw=False,
                                strict_map_key=False)
        found.append((pos, [value] if isinstance(value[0], int) else value))
        pos += head + size
    assert pos == len(data)
    return found


def frame_sizes(path: Path) -> list[int]:
    data = path.read_bytes()
    sizes, pos = [], HEADER_BYTES
    while pos + RECORD_HEADER_BYTES <= len(data) and data[pos : pos + 8] != bytes(8):
        (size,) = struct.unpack_from(">I", data, pos + 8)
        sizes.append(size)
        pos += RECORD_HEADER_BYTES + size
    return sizes


def enqueued_in(records: list[Any]) -> set[str]:
    return {rec[1] for rec in records if rec[0] == Rec.ITEM_ENQUEUED}


def frame_enqueuing(path: Path, task_id: str) -> int:
    """The index of the frame that holds ``task_id``'s ITEM_ENQUEUED record."""
    return next(i for i, (_, recs) in enumerate(frames(path)) if task_id in enqueued_in(recs))


def enqueued_before(path: Path, index: int) -> set[str]:
    """The tasks enqueued in the frames before frame ``index``."""
    return {task for _, recs in frames(path)[:index] for task in enqueued_in(recs)}


# ---- the kill -9 loop ----------------------------------------------------------------------

KINDS = [
    "sigkill",
    "journal.before_write.kill",
    "journal.before_fsync.kill",
    "journal.after_fsync.kill",
    "snapshot.mid.kill",
    "snapshot.after_rename.kill",
]
KEYS = [f"key-{i}" for i in range(8)]
SCOPE = "crash"


def failpoint_for(kind: str, rng: random.Random) -> str | None:
    """The RSD_FAILPOINTS value for one cycle. Start-up itself writes and fsyncs once,
    so journal points are armed from their third visit on, and by the thirtieth."""
    if kind == "sigkill":
        return None
    if kind == "snapshot.mid.kill":
        return f"{kind}:1"  # counted in each forked writer, which reaches it once
    if kind == "snapshot.after_rename.kill":
        return f"{kind}:{rng.randint(1, 3)}"
    return f"{kind}:{rng.randint(3, 30)}"


@dataclass
class Slot:
    """One data directory going through crash cycles, and what its clients were told."""

    name: str
    index: int
    rsd: Rsd
    policies: list[str]
    seed: int
    ledger: Ledger = field(default_factory=Ledger)
    rng: random.Random = field(init=False)
    fired: dict[str, int] = field(default_factory=dict)  # failpoint kind -> times it fired
    cycles: int = 0
    from_snapshot: int = 0  # restarts that recovered from a snapshot

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


def check_never_repeats(ledger: Ledger, where: str) -> None:
    """Tokens grow in acknowledgement order (one connection, one counter); generations
    grow per key; task ids are never handed out twice."""
    tokens = ledger.tokens
    for before, after in itertools.pairwise(tokens):
        assert after > before, f"{where}: fencing token {after} after {before}"
    for key, grants in ledger.grants.items():
        generations = [generation for _, generation in grants]
        for before, after in itertools.pairwise(generations):
            assert after > before, f"{where}: {key} generation {after} after {before}"
    assert len(set(ledger.task_ids)) == len(ledger.task_ids), f"{where}: a task id repeated"


async def check_nothing_acknowledged_was_lost(client: AsyncRunstate, ledger: Ledger,
                                              where: str) -> None:
    scope = client.scope(SCOPE)
    task_ids = list(ledger.tasks)
    views = await asyncio.gather(
        *(scope.task(task_id).status() for task_id in task_ids), return_exceptions=True
    )
    for task_id, view in zip(task_ids, views, strict=True):
        ack = ledger.tasks[task_id]
        assert not isinstance(view, BaseException), f"{where}: task {task_id}: {view!r}"
        assert view["attempt"] >= ack.attempt, f"{where}: {task_id} went back: {view}"
        if ack.succeeded:
            assert view["state"] == "SUCCEEDED", f"{where}: {task_id} completed, now {view}"
            assert view["outcome"] == ack.outcome, f"{where}: {task_id} outcome {view}"
    inspected = await asyncio.gather(*(scope.claim(key).inspect() for key in ledger.grants))
    for key, view in zip(ledger.grants, inspected, strict=True):
        last = ledger.grants[key][-1][1]
        assert view["generation"] >= last, f"{where}: {key} generation went back: {view}"


async def crash_cycles(slot: Slot, cycles: int) -> None:
    rsd = slot.rsd
    ledger = slot.ledger
    previous: AsyncRunstate | None = None
    for cycle in range(cycles):
        where = f"{slot.name} cycle {cycle} (seed {slot.seed})"
        kind = KINDS[(cycle + slot.index) % len(KINDS)]
        policy = slot.policies[cycle % len(slot.policies)]
        snapshot_bytes = "4096" if kind.startswith("snapshot") else "32768"
        await rsd.start("--fsync", policy, "--snapshot-bytes", snapshot_bytes,
                        failpoints=failpoint_for(kind, slot.rng))
        if list(rsd.data.glob("snapshot-*.snap")):
            slot.from_snapshot += 1
        if cycle > 0:
            assert "the last stop was not clean" in rsd.log(), where
            assert not list(rsd.data.glob("*.tmp")), f"{where}: a snapshot .tmp survived"
        if previous is not None:
            await close_quietly(previous)  # releases what it held, on the new server
        # connect_timeout bounds the whole connect, handshake included: a second, as a
        # just-started rsd on a loaded machine may take half of one to answer HELLO.
        client = AsyncRunstate(holder=slot.name, address=rsd.address, connect_timeout=1.0)
        previous = client
        await client.scopes.create(id=SCOPE)  # runs must exist (idempotent)
        await check_nothing_acknowledged_was_lost(client, ledger, where)
        load = asyncio.ensure_future(
            run_load(client, SCOPE, f"{slot.name}.{cycle}", ledger, keys=KEYS)
        )
        exit_wait = asyncio.ensure_future(rsd.exited())
        # A failpoint ends the cycle when it fires; the limit only bounds a cycle whose
        # failpoint is not reached (under everysec or no, fsyncs are few), so on a
        # loaded machine an fsync-always cycle gets time enough to reach its visit.
        if kind == "sigkill":
            limit = slot.rng.uniform(0.1, 0.4)
        else:
            limit = 6.0 if policy == "always" else 2.0
        done, _ = await asyncio.wait({exit_wait, load}, timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
        if load in done and load.exception() is not None:
            await rsd.kill()
            raise load.exception()  # type: ignore[misc]
        if load in done and exit_wait not in done:
            # The load ends on the connection's loss, which a failpoint's kill causes: the
            # exit is polled, so it may be seen a moment later (not seeing it counted a
            # fired failpoint as not reached: 'journal.before_write.kill never fired').
            await asyncio.wait({exit_wait}, timeout=1.0)
        if exit_wait.done():
            slot.fired[kind] = slot.fired.get(kind, 0) + 1
        code = await rsd.kill()
        assert code == KILLED, f"{where}: rsd exited {code}; log:\n{rsd.log()}"
        failure = await asyncio.wait_for(load, 10)
        assert failure is None or isinstance(failure, UnavailableError), f"{where}: {failure!r}"
        check_never_repeats(ledger, where)
        slot.cycles += 1
    await rsd.start("--fsync", "always")
    if previous is not None:
        await close_quietly(previous)
    async with AsyncRunstate(holder=slot.name, address=rsd.address) as client:
        await client.scopes.create(id=SCOPE)  # runs must exist
        await check_nothing_acknowledged_was_lost(client, ledger, f"{slot.name} final")
        # One more grant per key: above everything any crashed server handed out.
        for key in KEYS:
            with contextlib.suppress(ConflictError):  # still held by a crashed cycle's lease
                lease = await client.scope(SCOPE).claim(key, lease_seconds=5).acquire()
                token = int(lease.token()[:16], 16)  # the lease id: the handle's first half
                ledger.tokens.append(token)
                ledger.grants.setdefault(key, []).append((token, lease.generation))
                await lease.release()
        check_never_repeats(ledger, f"{slot.name} final")
    assert await rsd.stop() == 0


async def test_kill_9_loop_loses_nothing_acknowledged_and_never_repeats_an_id(
    rsds: Callable[..., Rsd],
) -> None:
    seed = random.randrange(1 << 32)
    slots = [
        Slot(f"always{i}", i, rsds(f"always{i}"), ["always"], seed + i)
        for i in range(4)
    ]
    slots.append(
        Slot("lossy", 4, rsds("lossy"), ["everysec", "no"], seed + 4)
    )
    # Seven cycles a slot: each of the six kinds of crash in every slot (the kind turns
    # with the cycle), 35 crashes in all (ten a slot cost the suite a third more for
    # the same kinds: a run's grants, submits and completions are in the thousands).
    await asyncio.wait_for(asyncio.gather(*(crash_cycles(slot, 7) for slot in slots)), 120)
    assert sum(slot.cycles for slot in slots) >= 35
    total = Ledger()
    for slot in slots:
        for what, n in slot.ledger.counts.items():
            total.counts[what] = total.counts.get(what, 0) + n
    fired: dict[str, int] = {}
    for slot in slots:
        for kind, n in slot.fired.items():
            fired[kind] = fired.get(kind, 0) + n
    print(f"seed {seed}: {total.counts}; failpoints fired {fired}")
    # The load must have done real work, and the failpoints must really have fired.
    for what in ("grants", "submits", "deliveries", "completions"):
        assert total.counts.get(what, 0) >= 50, (what, total.counts)
    for kind in KINDS[1:]:
        assert fired.get(kind, 0) >= 1, f"{kind} never fired: {fired} (seed {seed})"
    assert sum(slot.from_snapshot for slot in slots) >= 5, "recovery never used a snapshot"


# ---- damaged files -------------------------------------------------------------------------


async def submit_tasks(address: str, keys: list[str], pad: int = 0) -> list[str]:
    """Submit one task per key, one after another; the task ids."""
    async with AsyncRunstate(holder="writer", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        return [(await box.submit({"key": key, "pad": "x" * pad}, key=key)).id for key in keys]


async def existing(address: str, task_ids: list[str]) -> list[bool]:
    async with AsyncRunstate(holder="reader", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        found = []
        for task_id in task_ids:
            try:
                await rs.scope("s").task(task_id).status()
            except NotFoundError:
                found.append(False)
            else:
                found.append(True)
        return found


async def test_garbage_after_the_last_record_is_a_torn_tail(rsds: Callable[..., Rsd]) -> None:
    rsd = rsds()
    address = await rsd.start()
    tasks = await submit_tasks(address, [f"t{i}" for i in range(10)])
    await rsd.kill()
    last = rsd.segments()[-1]
    size = records_end(last)
    with open(last, "r+b") as f:
        f.seek(size)
        f.write(b"\x00\x01garbage" * 20)
    address = await rsd.start()
    log = rsd.log()
    assert "torn tail" in log and str(last) in log and f"offset {size}" in log, log
    assert await existing(address, tasks) == [True] * 10
    assert last.stat().st_size == size  # cut back to the last whole record
    assert await rsd.stop() == 0


async def test_a_last_record_cut_short_is_a_torn_tail(rsds: Callable[..., Rsd]) -> None:
    rsd = rsds()
    address = await rsd.start()
    tasks = await submit_tasks(address, [f"t{i}" for i in range(10)])
    await rsd.kill()
    last = rsd.segments()[-1]
    offset, records = frames(last)[-1]
    assert tasks[-1] in enqueued_in(records)
    kept = enqueued_before(last, len(frames(last)) - 1)
    assert set(tasks[:-1]) <= kept  # submitted one by one: one write each
    cut = offset + (records_end(last) - offset) // 2
    with open(last, "r+b") as f:
        f.truncate(cut)
    address = await rsd.start()
    log = rsd.log()
    assert "torn tail" in log and str(last) in log and f"offset {offset}" in log, log
    # Every record before the cut is kept; the cut write (artificially torn) is gone.
    assert await existing(address, tasks) == [True] * 9 + [False]
    assert await rsd.stop() == 0


async def test_a_torn_record_holding_record_like_client_bytes_is_still_a_torn_tail(
    rsds: Callable[..., Rsd],
) -> None:
    rsd = rsds()
    address = await rsd.start()
    tasks = await submit_tasks(address, [f"t{i}" for i in range(3)])
    async with AsyncRunstate(holder="binary", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        shutdown = [Rec.CLEAN_SHUTDOWN, 0.0]  # as an old rsd framed it, and with a guessed salt
        blob = b"header" + logfile_v1.encode_record(shutdown) + b"\x00" * 64
        blob += encode_record(shutdown, new_salt()) + b"\x00" * 64
        await rs.scope("s").mailbox("jobs").submit(blob, key="blob")
    await rsd.kill()
    last = rsd.segments()[-1]
    offset = frames(last)[-1][0]
    with open(last, "r+b") as f:
        f.truncate(records_end(last) - 10)  # the crash cut the last write short
    address = await rsd.start()
    log = rsd.log()
    assert "torn tail" in log and f"offset {offset}" in log, log
    assert await existing(address, tasks) == [True] * 3
    assert await rsd.stop() == 0


async def test_damage_in_the_middle_refuses_to_start_unless_repair(
    rsds: Callable[..., Rsd],
) -> None:
    rsd = rsds()
    address = await rsd.start()
    tasks = await submit_tasks(address, [f"t{i}" for i in range(10)])
    assert await rsd.stop() == 0
    last = rsd.segments()[-1]
    victim = frame_enqueuing(last, tasks[4])
    offset = frames(last)[victim][0]
    assert enqueued_before(last, victim) == set(tasks[:4])
    data = bytearray(last.read_bytes())
    data[offset + 12] ^= 0x20  # inside the payload: the CRC no longer matches
    last.write_bytes(bytes(data))

    assert await rsd.refused() == 2
    log = rsd.log()
    assert str(last) in log and f"offset {offset}" in log, log
    assert "--repair" in log
    assert await rsd.refused() == 2  # and again: refusing changed nothing on disk

    address = await rsd.start("--repair")
    log = rsd.log()
    assert str(last) in log and f"offset {offset}" in log, log
    assert await existing(address, tasks) == [True] * 4 + [False] * 6
    assert await rsd.stop() == 0
    address = await rsd.start()  # the repaired directory starts without --repair
    assert await existing(address, tasks) == [True] * 4 + [False] * 6
    assert await rsd.stop() == 0


async def churn(address: str, grants: int, keys: int = 40) -> tuple[int, dict[str, int]]:
    """Acquire and release ``grants`` times over ``keys`` keys, concurrently: the highest
    token handed out, and each key's last generation."""
    top = 0
    last: dict[str, int] = {}
    async with AsyncRunstate(holder="churn", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        async def one(key: str, times: int) -> None:
            nonlocal top
            claim = rs.scope("s").claim(key, lease_seconds=5)
            for _ in range(times):
                lease = await claim.acquire()
                top = max(top, int(lease.token()[:16], 16))
                last[key] = lease.generation
                await lease.release()

        await asyncio.gather(*(one(f"c{i}", grants // keys) for i in range(keys)))
    return top, last


async def first_grants(address: str, keys: list[str]) -> dict[str, tuple[int, int]]:
    async with AsyncRunstate(holder="after", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        got = {}
        for key in keys:
            lease = await rs.scope("s").claim(key, lease_seconds=5).acquire()
            got[key] = (int(lease.token()[:16], 16), lease.generation)
            await lease.release()
        return got


async def test_repair_of_mid_segment_damage_never_reuses_a_fencing_token(
    rsds: Callable[..., Rsd],
) -> None:
    """--repair may drop records, but a fencing token a client saw must never be handed
    out again: that is what fences a stale owner off."""
    rsd = rsds()
    address = await rsd.start("--fsync", "no")
    tasks = await submit_tasks(address, ["early"])
    top, _ = await churn(address, 4400)  # crosses an id reservation block
    assert await rsd.stop() == 0
    last = rsd.segments()[-1]
    data = bytearray(last.read_bytes())
    data[frames(last)[frame_enqueuing(last, tasks[0])][0] + 12] ^= 0x20
    last.write_bytes(bytes(data))
    address = await rsd.start("--repair")
    after = await first_grants(address, ["c0", "c1", "fresh"])
    for key, (token, _) in after.items():
        assert token > top, f"token {token} for {key} was already handed out (up to {top})"
    assert await rsd.stop() == 0


async def test_repair_of_a_damaged_snapshot_never_reuses_tokens_or_generations(
    rsds: Callable[..., Rsd],
) -> None:
    rsd = rsds()
    address = await rsd.start("--snapshot-bytes", "4096")
    top, last_generation = await churn(address, 400, keys=4)
    # Big records push the journal past the threshold until a snapshot covers every
    # grant: the newest segment (after that snapshot) then holds no grant at all.
    for attempt in range(100):
        snaps = sorted(rsd.data.glob("snapshot-*.snap"))
        newest = rsd.segments()[-1]
        if snaps and seq_of(snaps[-1]) + 1 == seq_of(newest) and not any(
            rec[0] == Rec.CLAIM_GRANTED for rec in scan(newest, JOURNAL_MAGIC).records
        ):
            break
        await submit_tasks(address, [f"big{attempt}"], pad=5000)
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("no snapshot covering the grants was written")
    await submit_tasks(address, ["after-the-snapshot"])
    assert await rsd.stop() == 0
    assert not any(
        rec[0] == Rec.CLAIM_GRANTED for rec in scan(rsd.segments()[-1], JOURNAL_MAGIC).records
    )
    snapshot = sorted(rsd.data.glob("snapshot-*.snap"))[-1]
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0x20
    snapshot.write_bytes(bytes(data))

    assert await rsd.refused() == 2
    assert str(snapshot.name) in rsd.log() and "--repair" in rsd.log()

    address = await rsd.start("--repair")
    after = await first_grants(address, list(last_generation))
    for key, (token, generation) in after.items():
        assert token > top, f"token {token} for {key} was already handed out (up to {top})"
        assert generation > last_generation[key], f"{key} generation went back"
    assert await rsd.stop() == 0


def seq_of(path: Path) -> int:
    return int(path.stem.split("-")[1], 16)


async def wait_for_snapshot_of(rsd: Rsd, address: str, task_ids: list[str]) -> None:
    """Until a snapshot holds every task in ``task_ids``: the newest segment (the one
    after the newest snapshot) enqueues none of them. Filler submits push the journal
    past the snapshot threshold meanwhile."""
    for attempt in range(100):
        snaps = sorted(rsd.data.glob("snapshot-*.snap"))
        newest = rsd.segments()[-1]
        if (
            snaps
            and seq_of(snaps[-1]) + 1 == seq_of(newest)
            and not enqueued_in(scan(newest, JOURNAL_MAGIC).records) & set(task_ids)
        ):
            return
        await submit_tasks(address, [f"filler{attempt}"], pad=240_000)
        await asyncio.sleep(0.05)
    raise AssertionError("no snapshot holding the tasks was written")


async def test_a_snapshot_of_large_payloads_reads_back(rsds: Callable[..., Rsd]) -> None:
    """40 tasks of 240 KB (under 10 MB of live state) and a clean stop: rsd must start."""
    rsd = rsds()
    address = await rsd.start("--fsync", "no", "--snapshot-bytes", "9500000")
    tasks = await submit_tasks(address, [f"big{i}" for i in range(40)], pad=240_000)
    await wait_for_snapshot_of(rsd, address, tasks)
    assert await rsd.stop() == 0
    snapshot = sorted(rsd.data.glob("snapshot-*.snap"))[-1]
    # What the reader will refuse (checked first: the refusal itself is slow to reach).
    assert max(frame_sizes(snapshot)) <= MAX_RECORD_BYTES
    address = await rsd.start()
    assert await existing(address, tasks) == [True] * len(tasks)
    assert await rsd.stop() == 0


async def test_a_burst_of_large_submits_from_many_clients_survives_a_crash(
    rsds: Callable[..., Rsd],
) -> None:
    """64 clients each submit a 240 KB task at once: one loop turn's records. Whatever
    their total size, they must be written so that recovery reads them back."""
    rsd = rsds()
    address = await rsd.start()
    clients = [AsyncRunstate(holder=f"c{i}", address=address) for i in range(64)]
    acked: list[str] = []
    biggest = 0
    try:
        await asyncio.gather(*(client.connect() for client in clients))
        await clients[0].mailboxes.ensure("jobs")
        await clients[0].scopes.create(id="s")  # runs must exist
        for round_no in range(6):  # until one loop turn's records exceed the limit
            tickets = await asyncio.gather(*(
                client.scope("s").mailbox("jobs").submit(
                    {"pad": "x" * 240_000}, key=f"r{round_no}-{i}"
                )
                for i, client in enumerate(clients)
            ))
            acked += [ticket.id for ticket in tickets]
            sizes = [size for segment in rsd.segments() for size in frame_sizes(segment)]
            biggest = max([biggest, *sizes])
            if biggest > MAX_RECORD_BYTES:
                break
    finally:
        await asyncio.gather(*(close_quietly(client) for client in clients))
    # What recovery will refuse (checked first: the refusal itself is slow to reach).
    assert biggest <= MAX_RECORD_BYTES, f"a write of {biggest} bytes in one frame"
    await rsd.kill()
    address = await rsd.start()
    assert await existing(address, acked) == [True] * len(acked)
    assert await rsd.stop() == 0


# ---- failing disks -------------------------------------------------------------------------


async def submit_until_failure(address: str) -> tuple[list[tuple[str, str]], list[str], int]:
    """Submit in rounds of 4 concurrent requests until the connection drops.

    Returns the acknowledged (key, task id) pairs, the keys whose submit failed, and the
    number of rounds."""
    acked: list[tuple[str, str]] = []
    failed: list[str] = []
    async with AsyncRunstate(holder="writer", address=address, connect_timeout=1.0) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        for round_no in range(200):
            keys = [f"r{round_no}-{i}" for i in range(4)]
            replies = await asyncio.gather(
                *(box.submit({"key": key}, key=key) for key in keys), return_exceptions=True
            )
            for key, reply in zip(keys, replies, strict=True):
                if isinstance(reply, BaseException):
                    assert isinstance(reply, UnavailableError), repr(reply)
                    failed.append(key)
                else:
                    acked.append((key, reply.id))
            if failed:
                return acked, failed, round_no + 1
    raise AssertionError("the failpoint never fired")


@pytest.mark.parametrize(
    ("failpoint", "policy", "message"),
    [
        ("journal.write.enospc:12", "always", "journal write failed"),
        ("journal.write.enospc:12", "no", "journal write failed"),
        ("journal.fsync.eio:12", "always", "journal fsync failed"),
    ],
)
async def test_a_failing_write_or_fsync_exits_74_without_acknowledging(
    rsds: Callable[..., Rsd], failpoint: str, policy: str, message: str
) -> None:
    rsd = rsds()
    address = await rsd.start("--fsync", policy, failpoints=failpoint)
    acked, failed, _ = await submit_until_failure(address)
    assert acked, "some submits should have gone through before the failure"
    assert await rsd.exited(10) == 74
    log = rsd.log()
    assert message in log and "without acknowledging" in log, log
    address = await rsd.start()
    assert await existing(address, [task for _, task in acked]) == [True] * len(acked)
    if "enospc" in failpoint:
        # Nothing of the failed write reached the file: those submits never happened.
        async with AsyncRunstate(holder="again", address=address) as rs:
            await rs.scopes.create(id="s")  # runs must exist
            box = rs.scope("s").mailbox("jobs")
            for key in failed:
                assert (await box.submit({"key": key, "pad": ""}, key=key)).created, key
    assert await rsd.stop() == 0


# ---- restarts under live leases ------------------------------------------------------------


async def test_leases_live_at_a_restart_survive_it_and_orphans_expire_a_lease_later(
    rsds: Callable[..., Rsd],
) -> None:
    """The holder keeps renewing across the restart (the SDK reconnects on its own) and
    keeps its claim and its delivery; a claim whose holder died meanwhile is not taken
    over before one full lease after the restart. After a clean stop (SIGTERM) and after
    a crash (SIGKILL), side by side."""
    await asyncio.gather(
        restart_under_live_leases(rsds("term"), "sigterm"),
        restart_under_live_leases(rsds("kill"), "sigkill"),
    )


# The keeper's own leases, held across the restart: the SDK gives one up once no renewal
# was confirmed within its length less a margin (a 5 s lease 4 s after the last confirmed
# renewal's send), and a stop, a new rsd process and the reconnect outlast that on a
# loaded machine (as in test_connection_events). Nothing waits them out; the orphan's
# lease is the one whose expiry is timed: short (the server's test-only lower minimum),
# yet longer than a start of rsd on a quiet machine, so that a server which freed it at
# its start (not a full lease later) is seen doing so.
LIVE_LEASE = 60
ORPHAN_LEASE = 2 * SHORT_LEASE


async def restart_under_live_leases(rsd: Rsd, how: str) -> None:
    address = await rsd.start(*SHORT_LEASES)
    holder: asyncio.subprocess.Process | None = None
    try:
        async with AsyncRunstate(holder="keeper", address=address) as rs:
            await rs.scopes.create(id="s")  # runs must exist
            run = rs.scope("s")
            lease = await run.claim("live", lease_seconds=LIVE_LEASE).acquire()
            await rs.mailboxes.ensure("jobs")
            ticket = await run.mailbox("jobs").submit({"n": 1}, key="long")
            started = asyncio.Event()
            finish = asyncio.Event()
            stop = asyncio.Event()
            seen: list[Any] = []

            async def handler(data: Any, delivery: Any) -> None:
                seen.append(delivery)
                started.set()
                await finish.wait()
                await delivery.complete(result={"payload": "done after the restart"})
                stop.set()

            consumer = asyncio.ensure_future(
                run.mailbox("jobs").consume(handler, lease_seconds=LIVE_LEASE, stop_event=stop)
            )
            await asyncio.wait_for(started.wait(), 10)

            # The orphan is taken last and rsd stopped at once: its lease is live (and
            # renewed) up to the stop, whatever the load; its holder dies while rsd is
            # down, so nothing renews it after the restart.
            holder = await asyncio.create_subprocess_exec(
                sys.executable, str(HELPERS / "holder.py"), address, "s", "orphan",
                "--lease-seconds", f"{ORPHAN_LEASE:g}", stdout=subprocess.PIPE,
                env=subprocess_env(),
            )
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), 10)
            assert line.startswith(b"ACQUIRED "), line
            if how == "sigterm":
                assert await rsd.stop() == 0
            else:
                assert await rsd.kill() == KILLED
            os.kill(holder.pid, signal.SIGKILL)  # the orphan's holder dies while rsd is down
            await holder.wait()
            loop = asyncio.get_running_loop()
            # The server counts the restart from when it has read its state: after the
            # spawn, before the listening line. The orphan may not be freed before one
            # full lease from the spawn, and must be soon after one from that line.
            spawned = loop.time()
            await rsd.start(*SHORT_LEASES)
            restarted = loop.time()
            assert ("the last stop was not clean" in rsd.log()) is (how == "sigkill")

            async with AsyncRunstate(holder="observer", address=address) as observer:
                await observer.scopes.create(id="s")  # runs must exist
                orphan = observer.scope("s").claim("orphan")
                freed = None
                while freed is None and loop.time() < restarted + ORPHAN_LEASE + 2.0:
                    view = await orphan.inspect()
                    if not view["held"]:
                        freed = loop.time()
                    else:
                        await asyncio.sleep(0.05)
                assert freed is not None, "the orphan claim never expired"
                assert freed - spawned >= ORPHAN_LEASE, (
                    f"orphan freed {freed - spawned:.2f} s after rsd was started again")
                assert freed - restarted <= ORPHAN_LEASE + 1.5, (
                    f"orphan freed {freed - restarted:.2f} s after restart")

                view = await observer.scope("s").claim("live").inspect()
                assert view["held"] and view["holder"] == "keeper", view
                # The holder's generation, also after a crash (only the next grant jumps).
                assert view["generation"] == lease.generation
                assert await observer.fence.status("s", "live", lease.token()) == {
                    "current": True, "generation": lease.generation}
                assert not lease.is_lost
                assert not seen[0].is_lost

            finish.set()
            await asyncio.wait_for(consumer, 10)
            result = await ticket.result(timeout_ms=5000)
            assert result["state"] == "SUCCEEDED"
            assert result["outcome"] == "done after the restart"
            assert result["attempt"] == 1
            await lease.release()
    finally:
        if holder is not None and holder.returncode is None:
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
    assert await rsd.stop() == 0


# ---- wall-clock instants ------------------------------------------------------------------


async def test_wall_clock_instants_that_passed_while_down_take_effect_at_start(
    rsds: Callable[..., Rsd],
) -> None:
    """Deadlines, retention and dedupe windows are wall-clock instants: one that passed
    while rsd was down takes effect right after it starts."""
    windows = ("--retention-seconds", "1", "--dedupe-seconds", "1")
    rsd = rsds()
    address = await rsd.start(*windows)
    async with AsyncRunstate(holder="w", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        await rs.mailboxes.ensure("jobs")
        box = rs.scope("s").mailbox("jobs")
        done = await box.submit({"n": 1}, key="done")
        delivery = await box.receive(lease_seconds=5)
        assert delivery is not None and delivery.task_id == done.id
        await delivery.complete(result={"payload": "kept until retention ends"})
        timed = await box.submit({"n": 2}, key="timed", deadline=time.time() + 1.0)
        first = await box.send({"m": 1}, work_key="w")
        assert (await box.send({"m": 1}, work_key="w"))["replay"] is True
    await rsd.kill()
    await asyncio.sleep(1.3)  # every window ends while rsd is down
    address = await rsd.start(*windows)
    async with AsyncRunstate(holder="w", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        run = rs.scope("s")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        while True:
            timed_view = await run.task(timed.id).status()
            done_view = await run.task(done.id).status()
            if timed_view["state"] == "EXPIRED" and done_view["tombstoned"]:
                break
            assert loop.time() < deadline, (timed_view, done_view)
            await asyncio.sleep(0.02)
        assert done_view["state"] == "SUCCEEDED" and done_view["outcome"] is None
        again = await run.mailbox("jobs").send({"m": 1}, work_key="w")
        assert again["replay"] is False and again["id"] != first["id"]
    assert await rsd.stop() == 0


# ---- generations across restarts -----------------------------------------------------------


async def grant_rounds(address: str, keys: list[str], rounds: int) -> dict[str, tuple[int, int]]:
    """Acquire and release each key ``rounds`` times: key -> (last token, generation)."""
    last: dict[str, tuple[int, int]] = {}
    async with AsyncRunstate(holder="g", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        for _ in range(rounds):
            for key in keys:
                lease = await rs.scope("s").claim(key, lease_seconds=5).acquire()
                last[key] = (int(lease.token()[:16], 16), lease.generation)
                await lease.release()
    return last


async def generations(address: str, keys: list[str]) -> dict[str, int]:
    async with AsyncRunstate(holder="g", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        return {key: (await rs.scope("s").claim(key).inspect())["generation"] for key in keys}


async def test_clean_restart_keeps_generations_exactly_unclean_never_goes_back(
    rsds: Callable[..., Rsd],
) -> None:
    keys = ["a", "b", "c"]
    rsd = rsds()
    address = await rsd.start()
    first = await grant_rounds(address, keys, 3)
    seen = await generations(address, keys)
    for key in keys:  # a free key reads at least the generation its last owner had
        assert seen[key] >= first[key][1]
    assert await rsd.stop() == 0

    address = await rsd.start()
    assert "not clean" not in rsd.log()
    assert await generations(address, keys) == seen
    second = await grant_rounds(address, keys, 1)
    max_token = max(token for token, _ in first.values())
    top = max(seen.values())
    for key in keys:
        assert second[key][1] > seen[key]
        # each grant is at most one above the highest before it: no jump
        assert second[key][1] <= top + len(keys), "a clean restart must not jump"
        assert second[key][0] > max_token
    await rsd.kill()

    address = await rsd.start()
    assert "the last stop was not clean" in rsd.log()
    after = await generations(address, keys)
    for key in keys:
        assert after[key] >= second[key][1], "a generation went back after a crash"
    third = await grant_rounds(address, keys, 1)
    max_token = max(token for token, _ in second.values())
    for key in keys:
        assert third[key][1] > second[key][1]
        assert third[key][0] > max_token
    assert await rsd.stop() == 0


async def test_a_new_key_after_a_crash_starts_above_every_generation_handed_out(
    rsds: Callable[..., Rsd],
) -> None:
    """Under ``no`` a crash can lose grants; a key first seen afterwards must not start
    at a generation some lost grant of the same key already had."""
    rsd = rsds()
    address = await rsd.start("--fsync", "no")
    before = await grant_rounds(address, ["x"], 5)
    await rsd.kill()
    address = await rsd.start("--fsync", "no")
    after = await grant_rounds(address, ["x", "fresh"], 1)
    assert after["x"][1] > before["x"][1]
    assert after["x"][0] > before["x"][0] and after["fresh"][0] > before["x"][0]
    assert after["fresh"][1] > 1, "the floor for new keys did not jump after the crash"
    assert await rsd.stop() == 0

