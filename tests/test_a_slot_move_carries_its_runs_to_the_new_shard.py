"""``rsctl slots move`` of slots that hold runs, between two real one-node shards (``--fsync
always``) over one etcd: the source holds the slots' requests, answers their waits
MOVED, sends the runs' state to the target (SLOTS_IMPORT, each part durable there before
its answer), switches the map, drops the runs and answers the held requests MOVED
(rsd/wire/slotmoves.py, slotimport.py; the core's half: rsd/core/transfer.py).

- a run with a claim held, a task queued, a task in flight and a finished task's result
  moves while a client of both addresses keeps writing to it: on the new shard the
  claim's token is current and the delivery still runs, the result is read, the queued
  task is received and completed, every write acknowledged during the move is there, and
  a new grant of the claim's key has a higher generation than any before; the source's
  other runs are untouched. (The holder's lease follows its run to the new shard: its
  tests are test_a_lease_and_a_delivery_follow_their_run_across_a_slot_move.py's.)
- the source killed (-9) right after the switch, before its drop (a failpoint): the
  slots stay on the target with the runs and every write acknowledged before the kill
  is read there; the source, started again, drops the runs the map gave away (once
  they have been strays for a while: half a second here, a test-only flag);
- a run holding a pool slot does not move: the move is refused, saying why, nothing
  changes, and the runs go on at the source.

The write pause (how long the moved slots' requests were held) is printed from the
source's log line; it is measured, not asserted.

The module's tests share one etcd, each its own cluster on it; the first and the last
share their two shards too (their runs and slots are apart: 100-199 moved to s2, then a
move of 600-700 refused), the kill's shards are its own.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import pytest_asyncio
from support.cluster import kill_all
from support.etcd import EtcdCluster
from support.process import Rsd
from support.shards import led, shard_args, slot_map

from rsclient import AsyncRunstate
from rsctl.main import run as rsctl
from rsd.cli import parse_args
from rsd.options import TEST_ONLY_ENVIRONMENT
from rsd.wire.slotimport import Imports
from rsproto.slots import slot_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOTS = 1024
WITHIN = 30.0  # seconds for both shards to lead, generously (a loaded machine)
# Runs a node's map gives another shard are strays for twice the cluster lease (4 s)
# before it drops them (rsd/wire/slotimport.py); the restarted source's wait, when no move
# is under way, is lowered by a test-only flag.
STRAYS_SOONER = ("--test-stray-settle-seconds", "0.5")
AFTER_THE_MOVE = 20  # writes the client makes once the move is answered, on the new shard
HELD = re.compile(r"slots (\d+)-(\d+) moved to shard '(\w+)' .* with (\d+) runs; their "
                  r"requests were held ([\d.]+) ms")


def flags(etcd: EtcdCluster, name: str, cluster: str = "moves") -> list[str]:
    return shard_args(etcd, name, cluster=cluster, fsync="no")


def placement(lo: int, hi: int, prefix: str) -> str:
    """A placement whose slot is in ``lo``..``hi``."""
    return next(f"{prefix}{n}" for n in range(100_000)
                if lo <= slot_of(f"{prefix}{n}", SLOTS) <= hi)


async def until(check: Callable[[], bool], what: str, timeout: float = WITHIN) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member for the module's clusters."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), 1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shards(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdCluster,
                 ) -> AsyncIterator[tuple[EtcdCluster, Rsd, Rsd]]:
    """s1 (made the map: every slot) and s2 (none), each one node, of cluster "moves"."""
    root = tmp_path_factory.mktemp("moves")
    s1, s2 = Rsd(root / "s1"), Rsd(root / "s2")
    try:
        await s1.start(*flags(etcd, "s1"))
        await s2.start(*flags(etcd, "s2"))
        await led(s1.address)
        yield etcd, s1, s2
    finally:
        await kill_all([s1, s2])


async def move(address: str, lo: int, hi: int, to: str, capsys: pytest.CaptureFixture[str],
               status: int = 0) -> str:
    """``rsctl slots move LO-HI --to TO`` against ``address``: its output."""
    capsys.readouterr()
    got = await rsctl(["--address", address, "slots", "move", f"{lo}-{hi}", "--to", to])
    out, err = capsys.readouterr()
    assert got == status, (out, err)
    return out + err


def held_ms(log: str, capsys: pytest.CaptureFixture[str]) -> float:
    """The write pause of the last move the node's ``log`` tells of, printed."""
    found = HELD.findall(log)
    assert found, log[-3000:]
    lo, hi, to, runs, ms = found[-1]
    with capsys.disabled():
        print(f"\nslots {lo}-{hi} to {to} with {runs} runs: requests held {ms} ms")
    return float(ms)


async def test_a_run_moved_with_its_slots_keeps_its_claim_tasks_and_results(
    shards: tuple[EtcdCluster, Rsd, Rsd], capsys: pytest.CaptureFixture[str],
) -> None:
    _, s1, s2 = shards
    lo, hi = 100, 199
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.mailboxes.ensure("work", mode="WORK")
        moving = await rs.scopes.create(placement=placement(lo, hi, "m"))
        staying = await rs.scopes.create(placement=placement(300, 400, "s"))
        work = moving.mailbox("work")
        lease = await moving.claim("k", lease_seconds=5).acquire()
        before = lease.generation
        done = await work.submit({"n": 0})
        first = await work.receive(lease_seconds=30)
        assert first is not None and first.task_id == done.id
        await first.complete(result={"payload": {"n": 0}})
        flight = await work.submit({"n": 1})
        delivery = await work.receive(lease_seconds=30)
        assert delivery is not None and delivery.task_id == flight.id
        queued = await work.submit({"n": 2})
        kept = await staying.claim("k", lease_seconds=5).acquire()
        stays = await staying.mailbox("work").submit({"n": 3})

        moved = asyncio.Event()

        async def writes() -> list[str]:  # the client keeps writing while the slots move
            acked: list[str] = []
            after = 0  # writes acknowledged once the move was answered
            while after < AFTER_THE_MOVE:
                n = 100 + len(acked)
                acked.append((await work.submit({"n": n}, key=f"w{n}")).id)
                after += moved.is_set()
                await asyncio.sleep(0.005)
            return acked

        writer = asyncio.create_task(writes())
        await asyncio.sleep(0.2)
        said = await move(s1.address, lo, hi, "s2", capsys)
        moved.set()
        assert "s2" in said
        acked = await writer
        assert len(acked) > AFTER_THE_MOVE  # some before and during the move too

        held_ms(s1.log(), capsys)
        # The claim's lease and the delivery's moved with their run, live on s2: the
        # lease's token is current there, the delivery still runs.
        assert (await rs.fence.status(moving, "k", lease.token()))["current"]
        assert (await flight.status())["state"] == "RUNNING"
        assert (await done.result())["outcome"] == {"n": 0}
        taken = await work.receive(lease_seconds=30)
        assert taken is not None and taken.task_id == queued.id
        await taken.complete(result={"payload": {"n": 2}})
        assert (await queued.result())["outcome"] == {"n": 2}
        for task in acked:
            assert (await moving.task(task).status())["state"] == "PENDING"
        # A new grant of the key, once the moved lease has ended on s2, is above it.
        await lease.release()  # (the lease followed its run: released on s2)
        again = await moving.claim("k", lease_seconds=5).acquire(wait=True, timeout_ms=20_000)
        assert again.generation > before
        assert not (await rs.fence.status(moving, "k", lease.token()))["current"]
        await again.release()
        # The source's other run is untouched; the moved one is gone from it.
        assert (await staying.claim("k").inspect())["held"] and not kept.is_lost
        assert (await staying.task(stays.id).status())["state"] == "PENDING"
        where = await slot_map(s2.address)
        assert where.owner(slot_of(moving.id, SLOTS)) == "s2"
        assert where.owner(slot_of(staying.id, SLOTS)) == "s1"


async def test_a_source_killed_after_the_switch_leaves_the_runs_on_the_target_and_drops_them(
    tmp_path: Path, etcd: EtcdCluster, capsys: pytest.CaptureFixture[str],
) -> None:
    s1, s2 = Rsd(tmp_path / "s1"), Rsd(tmp_path / "s2")
    lo, hi = 0, 511
    try:
        await s1.start(*flags(etcd, "s1", "killed"), failpoints="slots.after_switch.kill")
        await s2.start(*flags(etcd, "s2", "killed"))
        await led(s1.address)
        async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
            await rs.mailboxes.ensure("work", mode="WORK")
            moving = await rs.scopes.create(placement=placement(lo, hi, "m"))
            work = moving.mailbox("work")
            acked = [(await work.submit({"n": n}, key=f"k{n}")).id for n in range(50)]
            lease = await moving.claim("k", lease_seconds=30).acquire()
            capsys.readouterr()
            got = await rsctl(["--address", s1.address, "slots", "move", f"{lo}-{hi}",
                               "--to", "s2"])
            capsys.readouterr()
            assert got != 0  # the source died before answering
            await until(lambda: not s1.alive, "the failpoint did not kill the source")
            token = lease.token()
        # The map gave the slots to s2, which has the runs: every write acknowledged
        # before the kill is read there (by a client that knows only s2), once s2's watch
        # has seen the switch. Until then s2 sends a client to the dead source, for longer
        # than a client's 2 s connect on a machine loaded with CPU burners (seen once).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WITHIN
        while (await slot_map(s2.address)).owner(lo) != "s2":
            assert loop.time() < deadline, "s2 never saw the slot map's switch"
            await asyncio.sleep(0.05)
        async with AsyncRunstate(holder="reader", address=s2.address) as rs:
            moved = rs.scope(moving.id)
            for task in acked:
                assert (await moved.task(task).status())["state"] == "PENDING"
            assert (await rs.fence.status(moved, "k", token))["current"]
            where = await slot_map(s2.address)
            assert where.owner(lo) == where.owner(hi) == "s2"
        # The source, started again, drops the runs of the slots it gave away.
        await s1.start(*flags(etcd, "s1", "killed"), *STRAYS_SOONER)
        await until(lambda: "dropped 1 runs of slots 0-511" in s1.log(),
                    "the restarted source did not drop its strays")
    finally:
        await kill_all([s1, s2])


async def test_only_rsds_own_tests_may_drop_strays_sooner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """``--test-stray-settle-seconds`` is refused without RSD_TEST_ONLY_OPTIONS=1 (as
    every test-only option is); unset, strays wait twice the cluster lease."""
    flag, variable = STRAYS_SOONER[0], TEST_ONLY_ENVIRONMENT[0]
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit):
        parse_args(list(STRAYS_SOONER))
    assert f"argument {flag}: is for rsd's own tests only" in capsys.readouterr().err
    monkeypatch.setenv(variable, TEST_ONLY_ENVIRONMENT[1])
    assert parse_args(list(STRAYS_SOONER)).test_stray_settle_seconds == 0.5
    host = SimpleNamespace(cluster_lease_seconds=2)
    imports = Imports(cast(Any, host))
    assert imports.settle == 4.0  # as rsd is built
    imports.settle_seconds = parse_args([]).test_stray_settle_seconds  # (None: unset)
    assert imports.settle == 4.0


async def test_a_move_refused_by_the_core_rolls_back_and_the_runs_keep_working_on_the_source(
    shards: tuple[EtcdCluster, Rsd, Rsd], capsys: pytest.CaptureFixture[str],
) -> None:
    _, s1, s2 = shards
    tag = placement(600, 700, "p")
    slot = slot_of(f"{{{tag}}}", SLOTS)
    async with AsyncRunstate(holder="app", address=f"{s1.address},{s2.address}") as rs:
        await rs.mailboxes.ensure("work", mode="WORK")
        run = await rs.scopes.create(placement=tag)
        await rs.pools.ensure(f"{{{tag}}}gpu", size=1)
        held = await run.pool(f"{{{tag}}}gpu").acquire()
        said = await move(s1.address, 600, 700, "s2", capsys, status=1)
        assert "holds pool slots" in said, said
        assert (await slot_map(s1.address)).owner(slot) == "s1"
        ticket = await run.mailbox("work").submit({"n": 1})
        assert (await ticket.status())["state"] == "PENDING"
        await held.release()
