"""A move of slots that hold runs, cut by a fault, completes or rolls back: never two
owners of a slot, never none, nothing acknowledged lost (issue 32).

Two shards of one cluster (each a primary and its synchronous standby, ``--fsync
always``, a 2 s cluster lease but for the etcd fault) over etcd, ``a`` owning slots
0-511 and ``b`` 512-1023, and the randomized workload of the cluster history tests
(support/workload.py) over a run on each: ``moving``, in slots 256-511 of ``a``, and
``staying``, on ``b``; beside them in 256-511 a run of large tasks, so the move sends
its state in several parts. Under the workload, ``rsctl slots move 256-511 --to b`` is
asked of ``a``, and one fault lands at a step of it (a test seam holds the move there:
support/moves.py):

- ``source``: ``a``'s primary is killed (-9) mid-transfer, the target having taken the
  first part and not the second: the map is not switched, ``a``'s standby takes over
  with every run (the move rolled back), ``b`` holds a partial copy nobody routes to;
- ``target``: ``b``'s primary is killed (-9) mid-import, the same step seen from the
  other side: the source's transfer breaks, it rolls back and serves the slots again;
- ``etcd leader``: etcd's leader (of three members) is killed (-9) when every part was
  taken, just before the map's compare-and-swap: the switch goes through a new etcd
  leader, or fails and the move rolls back (as seen so far: the switch's read of the map
  is refused, "leader changed", and the move rolls back at once). The cluster lease is
  5 s here (the default), so that the fault stays etcd's alone: at etcd's own timing its
  next leader came about 2 s later on a loaded machine, which a 2 s lease did not outlive
  (both shards' primaries stepped down, and were started again as a supervisor would:
  exit 75). At the tests' etcd timing (support/etcd.py: QUICK) it comes in 0.2-0.4 s,
  but nothing here waits out a lease: the longer one costs no time.

Then the move is asked for again until done (the target drops an earlier attempt's
leftovers at its first part), the clients go on on ``b``, and:

- the histories keep every rule of the checker (support/history.py): no acknowledged
  change lost, one result per task, stale tokens refused (a token the old owner granted
  is refused by the new owner once the claim was granted there again: checked on purpose
  for every key granted on both sides), never two live holders, no reply from a replaced
  primary, no reply for the moved slots from ``a`` after the switch (which node answered
  each op is recorded), and every version of the slot map etcd kept covers each slot
  once, each one epoch above the last;
- after the fault the primaries' maps (SLOT_MAP, what ``rsctl slots`` prints) agree and
  give every slot one owner, and both runs are answered: changes acknowledged after the
  switch on ``moving``, after the fault on ``staying``.

The seed of the randomness is printed and named in a failure; ``RSD_HISTORY_SEED`` runs
one again. The histories are written beside the nodes; ``-s`` prints the fault table
(each run's acknowledged changes, lost ones, and its longest stretch without one from
the fault to the move's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cluster import LEASE, kill_all, named_syncs, primary, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, NodeKind, check, report
from support.moves import Seam, ask_move, etcd_leader, map_versions, move_until_done
from support.partitions import EXIT_STEPPED_DOWN
from support.process import Rsd
from support.shards import shard_args, slot_map
from support.workload import WRITES, Workload, done, unavailability

from rsclient import AsyncRunstate, RunstateError
from rsproto.slots import SlotMap, ranges_problem, slot_of

SHARDS = ("a", "b")
SLOTS = 1024
MOVING = (256, 511)  # a's slots that move to b
# Which shard's nodes the seam holds, and where: the source before it sends the second
# part (the first taken), the target before it imports the second, the source before
# its compare-and-swap (every part taken).
FAULTS = {
    "source": ("a", "slots.send_part.hold:2"),
    "target": ("b", "slots.import_part.hold:2"),
    "etcd leader": ("a", "slots.before_switch.hold"),
}
BALLAST = (12, 200_000)  # tasks and bytes each in the moving slots: about 5 parts
# Seconds the workload runs (drawn between the two) before the move is asked for, and at
# least after its switch: hundreds of ops, claims held across the fault; the ops each
# side must have acknowledged are waited for besides (Workload.until).
WORKING = (0.25, 0.5)


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member for the faults that leave etcd whole (each a cluster of its own
    name on it): the second is spared a start. The etcd leader's fault has three
    members of its own."""
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd"), 1).start()
    try:
        yield etcd
    finally:
        etcd.stop()


def placed_in(lo: int, hi: int, prefix: str) -> str:
    """A placement whose slot is in ``lo``..``hi``."""
    return next(f"{prefix}{n}" for n in range(100_000)
                if lo <= slot_of(f"{prefix}{n}", SLOTS) <= hi)


async def _syncs_named(leading: dict[str, Rsd], timeout: float = 30.0) -> None:
    """Until each shard's primary (``leading``: as watch_primaries saw them, a new one if
    it changes meanwhile) has named its synchronous standby."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not all(leading[shard].alive and named_syncs(leading[shard].log())
                  for shard in SHARDS):
        assert loop.time() < deadline, "no synchronous standby named: " + "\n".join(
            node.log()[-2000:] for node in leading.values())
        await asyncio.sleep(0.05)


async def _led(leading: dict[str, Rsd], timeout: float = 30.0) -> None:
    """Until each shard has a live primary (``leading``: as watch_primaries saw them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not all(shard in leading and leading[shard].alive for shard in SHARDS):
        assert loop.time() < deadline, f"the shards did not both lead: {leading}"
        await asyncio.sleep(0.05)


async def _ballast(addresses: str, timeout: float = 30.0) -> None:
    """A run in the moving slots holding ``BALLAST`` tasks: the move's state in parts.
    Each is submitted by key until acknowledged (a primary starved past its lease steps
    down, and what was in flight with it is not sent again unless its key makes it
    safe)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    count, size = BALLAST
    run = f"{{{placed_in(*MOVING, 'ballast')}}}ballast"  # chosen: made again harmlessly
    async with AsyncRunstate(holder="ballast", address=addresses) as rs:
        for n in range(count):
            while True:
                try:
                    await rs.mailboxes.ensure("ballast", mode="WORK")
                    box = (await rs.scopes.create(run)).mailbox("ballast")
                    await box.submit({"pad": "x" * size}, key=f"b{n}")
                    break
                except RunstateError:
                    assert loop.time() < deadline, "the ballast was never acknowledged"
                    await asyncio.sleep(0.1)


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_slot_move_cut_by_a_kill_completes_or_rolls_back_losing_nothing(
    fault: str, tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
    request: pytest.FixtureRequest,
) -> None:
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"\nhistory seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed)
    etcd: EtcdCluster = (etcd_cluster(3) if fault == "etcd leader"
                         else request.getfixturevalue("shared_etcd"))
    held, point = FAULTS[fault]
    seam = Seam(tmp_path, point)
    cluster = f"moves-{fault}" if fault != "etcd leader" else "moves"
    nodes = {shard: [Rsd(tmp_path / f"{shard}{i}") for i in range(2)] for shard in SHARDS}
    everyone = [node for shard in SHARDS for node in nodes[shard]]
    runs = ("moving", "staying")
    lease = "5" if fault == "etcd leader" else LEASE
    histories = {run: History(float(lease)) for run in runs}
    workloads: dict[str, Workload] = {}
    leading: dict[str, Rsd] = {}

    def flags(shard: str, i: int) -> list[str]:
        return shard_args(etcd, shard, f"{shard}{i}", lease, cluster=cluster)

    def seen_in(shard: str) -> Callable[[Rsd, int], None]:
        def seen(node: Rsd, epoch: int) -> None:
            leading[shard] = node
            for history in histories.values():
                history.node("primary", node.address, epoch, shard)
        return seen

    def primaries() -> dict[str, str]:
        return {shard: node.address for shard, node in leading.items()}

    def event(kind: NodeKind, node: Rsd, shard: str) -> float:
        at = 0.0
        for history in histories.values():
            at = history.node(kind, node.address, shard=shard).at
        return at

    supervisor: asyncio.Task[None] | None = None
    killing: set[Rsd] = set()  # killed by the test, which starts them again itself

    async def supervise() -> None:
        """Start again, as its supervisor would, a node that stepped down (exit 75: its
        leadership may have lapsed while etcd had no leader); any other exit fails."""
        while True:
            for shard in SHARDS:
                for i, node in enumerate(nodes[shard]):
                    if node in killing or node.alive or node.proc is None:
                        continue
                    code = await node.exited(0)
                    assert code == EXIT_STEPPED_DOWN, f"{node} exited {code}: {node.log()}"
                    event("started", node, shard)
                    await node.start(*flags(shard, i))
            await asyncio.sleep(0.05)

    try:
        # a0 makes the map (every slot a's), then everyone else starts; the seam's
        # shard is started with it.
        await nodes["a"][0].start(*flags("a", 0), env=seam.env if held == "a" else None)
        await asyncio.gather(*(node.start(*flags(shard, i),
                                          env=seam.env if held == shard else None)
                               for shard in SHARDS for i, node in enumerate(nodes[shard])
                               if node is not nodes["a"][0]))
        for shard in SHARDS:
            for node in nodes[shard]:
                event("started", node, shard)  # (no client yet: none answered before)
        # Supervised from the start: a primary starved past its lease by a loaded
        # machine steps down, and is started again (seen once while the suite ran).
        supervisor = asyncio.get_running_loop().create_task(supervise())
        async with watch_primaries(nodes["a"], seen_in("a")), \
                watch_primaries(nodes["b"], seen_in("b")):
            await _led(leading)
            await move_until_done(primaries, 512, 1023, "b")
            await _syncs_named(leading)
            addresses = ",".join(node.address for node in everyone)
            await _ballast(addresses)
            workloads["moving"] = Workload(histories["moving"], addresses,
                                           random.Random(rng.random()),
                                           placement=placed_in(*MOVING, "m"))
            workloads["staying"] = Workload(histories["staying"], addresses,
                                            random.Random(rng.random()),
                                            placement=placed_in(512, 1023, "s"))
            await asyncio.gather(*(workload.start() for workload in workloads.values()))
            await asyncio.sleep(rng.uniform(*WORKING))

            # The move, and the fault at the seam's step of it.
            source, target = leading["a"], leading["b"]
            seam.arm()
            asked = asyncio.create_task(ask_move(source.address, *MOVING, "b"))
            holder = source if held == "a" else target
            await seam.reached(lambda: holder.alive and not asked.done())
            killed: tuple[Rsd, str] | None = None
            if fault == "etcd leader":
                etcd.kill(etcd_leader(etcd))
                fault_at = histories["moving"].now()
            else:
                killed = (holder, held)
                killing.add(holder)
                fault_at = event("killed", holder, held)
                await holder.kill()
            seam.release()
            answered, answer = await asyncio.wait_for(asked, 60)
            if killed is not None:
                node, shard = killed
                assert not answered, f"a move cut mid-transfer was answered: {answer}"
                others = [other for other in nodes[shard] if other is not node]
                _, probe, _ = await primary(others, after=0)
                await probe.close()
                # It comes back as its shard's standby (under --fsync always a primary
                # alone acknowledges nothing).
                event("started", node, shard)
                await node.start(*flags(shard, nodes[shard].index(node)))
                killing.discard(node)
            # Completed or rolled back, never half: the map gives the slots to one shard.
            now = await _agreed_map(primaries)
            assert now.owner(MOVING[0]) == now.owner(MOVING[1]), now
            if killed is not None:
                assert now.owner(MOVING[0]) == "a", f"a move cut mid-transfer switched: {now}"
            print(f"{fault}: the first move {'completed' if answered else 'rolled back'} "
                  f"({answer})")
            moved = await move_until_done(primaries, *MOVING, "b")
            switched = histories["moving"].switched(
                *MOVING, "a", "b", moved.epoch, [node.address for node in nodes["a"]]).at
            await workloads["moving"].until(switched, rng.uniform(*WORKING), "submit",
                                            "complete", "acquire", "release")
            await workloads["staying"].until(fault_at, 0.0, "submit", "complete")
            fenced = await workloads["moving"].fence_across(switched)
            for name, workload in workloads.items():
                crashed = await workload.stop()
                assert not crashed, f"clients of {name} failed: {crashed} (seed {seed})"
                await workload.final_reads()
            maps = [await slot_map(address) for address in primaries().values()]
    finally:
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor  # (a node that exited otherwise fails the test here)
        for workload in workloads.values():
            await workload.close()
        await kill_all(everyone)
        for name, history in histories.items():
            history.dump(tmp_path / f"history-{name}.jsonl")
    versions = map_versions(etcd, cluster)
    for history in histories.values():
        history.maps = versions
    _print_table(fault, histories, fault_at, switched)
    for name, history in histories.items():
        violations = check(history)
        if violations:
            pytest.fail(f"run {name}: " + report(history, violations, seed)
                        + f"\nhistory: {tmp_path}/history-{name}.jsonl")
    _one_map(maps)
    assert all(entry.owner(MOVING[0]) == "b" for entry in maps), maps
    after = done(histories["moving"], switched, "submit", "complete")
    assert after["submit"] and after["complete"], f"moving after the move: {after} (seed {seed})"
    after = done(histories["staying"], fault_at, "submit", "complete")
    assert after["submit"] and after["complete"], f"staying after the fault: {after} ({seed})"
    b_nodes = {node.address for node in nodes["b"]}
    refused = [op for op in fenced if op.ok and op.node in b_nodes
               and not op.reply["current"]]
    assert refused, f"no old owner's token was checked on the new owner: {fenced} ({seed})"


async def _agreed_map(primaries: Callable[[], dict[str, str]],
                      timeout: float = 30.0) -> SlotMap:
    """The map once every shard's primary answers SLOT_MAP with the same one (after a
    fault a primary may be starting again, a map not yet seen everywhere)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        # (refused by a node not, or no longer, the primary: raw.py asserts a HELLO)
        with contextlib.suppress(OSError, EOFError, TimeoutError, AssertionError):
            maps = [await slot_map(address) for address in primaries().values()]
            if len({(seen.epoch, seen.ranges) for seen in maps}) == 1:
                return maps[0]
        assert loop.time() < deadline, "the shards' primaries never agreed on a map"
        await asyncio.sleep(0.1)


def _one_map(maps: list[SlotMap]) -> None:
    """The primaries' maps agree and give every slot one owner."""
    assert len({(entry.epoch, entry.ranges) for entry in maps}) == 1, maps
    assert ranges_problem([list(r) for r in maps[0].ranges], maps[0].slots) is None, maps


def _print_table(fault: str, histories: dict[str, History], start: float,
                 end: float) -> None:
    """The fault table's rows, for the log (tests assert rules, not timings)."""
    for name, history in histories.items():
        acked = sum(1 for op in history.ops if op.f in WRITES and op.ok)
        lost = len(check(history, ["acknowledged changes present"]))
        began, ended = unavailability(history, start, end)
        print(f"fault: kill -9 of the {fault} mid-move | run {name} | {acked} changes "
              f"acknowledged | {lost} lost | longest stretch without one "
              f"{ended - began:.2f} s")
