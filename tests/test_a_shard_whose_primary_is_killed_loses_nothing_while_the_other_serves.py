"""Two shards of one cluster (each a primary and its synchronous standby, ``--fsync
always``, a 2 s cluster lease) over one etcd, the slots split between them, and a
randomized workload over a run on each shard (support/workload.py: planners, workers,
holders; every client is given all four nodes and finds each run's shard itself). The
primary of shard ``a`` is killed (SIGKILL) mid-workload:

- shard ``b`` goes on acknowledging changes while ``a`` has no primary (a shard's loss
  costs only its own slots);
- ``a``'s standby takes over and, once the killed node is back as its standby, its run
  goes on;
- both histories keep every rule of the checker (support/history.py): no acknowledged
  change lost, never two live holders of one claim, one result per task, stale tokens
  refused, no reply from a replaced primary.

The seed of the randomness is printed and named in a failure; ``RSD_HISTORY_SEED`` runs
one again. The histories are written beside the nodes (``history-a.jsonl``, ``-b``).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import LEASE, kill_all, named_syncs, primary, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, check, report
from support.process import Rsd
from support.shards import move, placement_in, shard_args
from support.workload import WRITES, Workload, done, unavailability

SHARDS = ("a", "b")
# Seconds the workload runs (drawn between the two) before the kill, and at least after
# it: hundreds of ops, claims held across the kill; the ops a's run must have
# acknowledged after it are waited for besides (Workload.until).
BEFORE = (0.25, 0.5)
AFTER = (0.15, 0.4)


async def _sync_named(node: Rsd, timeout: float = 30.0) -> None:
    """Until ``node`` (a primary) has named its synchronous standby."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not named_syncs(node.log()):
        assert loop.time() < deadline and node.alive, node.log()[-3000:]
        await asyncio.sleep(0.05)


async def test_a_shard_whose_primary_is_killed_loses_nothing_while_the_other_serves(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed)
    etcd = etcd_cluster(1)
    nodes = {shard: [Rsd(tmp_path / f"{shard}{i}") for i in range(2)] for shard in SHARDS}
    everyone = [node for shard in SHARDS for node in nodes[shard]]
    histories = {shard: History(float(LEASE)) for shard in SHARDS}
    workloads: dict[str, Workload] = {}

    def seen_in(shard: str) -> Callable[[Rsd, int], None]:
        return lambda node, epoch: histories[shard].node("primary", node.address, epoch)

    try:
        # Shard a's first node makes the map (every slot a's), then everyone else starts.
        await nodes["a"][0].start(*shard_args(etcd, "a", "a0"))
        await asyncio.gather(*(node.start(*shard_args(etcd, shard, f"{shard}{i}"))
                               for shard in SHARDS for i, node in enumerate(nodes[shard])
                               if node is not nodes["a"][0]))
        leaders = {shard: await primary(nodes[shard]) for shard in SHARDS}
        for _, probe, _ in leaders.values():
            await probe.close()
        for shard in SHARDS:
            for node in nodes[shard]:
                histories[shard].node("started", node.address)
        owned = await move({shard: leaders[shard][0].address for shard in SHARDS},
                           512, 1023, "b")
        await asyncio.gather(*(_sync_named(leaders[shard][0]) for shard in SHARDS))
        addresses = ",".join(node.address for node in everyone)
        async with watch_primaries(nodes["a"], seen_in("a")), \
                watch_primaries(nodes["b"], seen_in("b")):
            for shard in SHARDS:
                workloads[shard] = Workload(histories[shard], addresses,
                                            random.Random(rng.random()),
                                            placement=placement_in(owned, shard))
            await asyncio.gather(*(workload.start() for workload in workloads.values()))
            await asyncio.sleep(rng.uniform(*BEFORE))
            first_a, _, epoch_a = leaders["a"]
            killed = histories["a"].node("killed", first_a.address)
            await first_a.kill()
            _, probe, _ = await primary(
                [node for node in nodes["a"] if node is not first_a], after=epoch_a)
            await probe.close()
            took_over = histories["b"].now()
            # It comes back as a's standby: a primary alone acknowledges nothing (--fsync
            # always waits for its synchronous standby).
            histories["a"].node("started", first_a.address)
            await first_a.start(*shard_args(etcd, "a", "a0"))
            await workloads["a"].until(killed.at, rng.uniform(*AFTER), "submit", "complete",
                                       "acquire", "release")
            for shard in SHARDS:
                crashed = await workloads[shard].stop()
                assert not crashed, f"clients of {shard} failed: {crashed} (seed {seed})"
                await workloads[shard].final_reads()
    finally:
        for workload in workloads.values():
            await workload.close()
        await kill_all(everyone)
        for shard in SHARDS:
            histories[shard].dump(tmp_path / f"history-{shard}.jsonl")
    for shard in SHARDS:  # for the log (tests assert rules, not timings)
        acked = sum(1 for op in histories[shard].ops if op.f in WRITES and op.ok)
        began, ended = unavailability(histories[shard], killed.at, took_over)
        print(f"shard {shard}: {acked} changes acknowledged, longest stretch without one "
              f"around the kill {ended - began:.2f} s")
    for shard in SHARDS:
        violations = check(histories[shard])
        if violations:
            pytest.fail(f"shard {shard}: " + report(histories[shard], violations, seed)
                        + f"\nhistory: {tmp_path}/history-{shard}.jsonl")
    # b acknowledged changes while a had no primary; a went on after its takeover.
    while_a_was_down = done(histories["b"], killed.at, "submit", "complete",
                            until=took_over)
    assert while_a_was_down["submit"] or while_a_was_down["complete"], (
        f"shard b acknowledged nothing while a was down: {while_a_was_down} (seed {seed})")
    after = done(histories["a"], killed.at, "submit", "complete", "acquire", "release")
    assert after["submit"] and after["complete"], f"a after the kill: {after} (seed {seed})"
