"""A randomized workload on a three-node cluster (``--fsync always``, a 2 s cluster
lease) whose primary is killed (SIGKILL) mid-workload, and whose next primary is then
paused (SIGSTOP) past its lease and woken: the whole history, recorded op by op
(support/history.py), keeps every rule of the checker: no acknowledged change lost,
never two live holders of one claim, one result per task (and a refused completion is
not it), stale tokens refused, no reply from a replaced primary.

The clients (support/workload.py): planners submit keyed tasks and wait for their
results, workers run ``consume()``, holders contend for claims and check their fencing
tokens (now and then an earlier grant's, which must be refused). The seed of
the randomness is printed, and named in a failure; ``RSD_HISTORY_SEED`` runs one again
(the same choices: keys, holds, pauses; the cluster's timing is its own). The history
is written beside the test's nodes (``history.jsonl``).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import LEASE, kill_all, node_args, primary, start_all, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, check, report
from support.process import Rsd
from support.workload import Workload, done

EXIT_STEPPED_DOWN = 75


async def test_a_cluster_history_through_a_kill_and_a_pause_breaks_no_rule(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed)
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE))
    workload: Workload | None = None

    def seen(node: Rsd, epoch: int) -> None:
        history.node("primary", node.address, epoch)

    try:
        await start_all(etcd, nodes)
        for node in nodes:
            history.node("started", node.address)
        everyone = ",".join(node.address for node in nodes)
        async with watch_primaries(nodes, seen):
            first, probe, epoch = await primary(nodes)
            await probe.close()
            workload = Workload(history, everyone, rng)
            await workload.start()
            loop = asyncio.get_running_loop()

            await asyncio.sleep(rng.uniform(0.5, 1.0))
            killed = history.node("killed", first.address)
            await first.kill()
            survivors = [node for node in nodes if node is not first]
            second, probe, epoch = await primary(survivors, after=epoch)
            await probe.close()
            # It comes back as a standby (in time to be the next primary's standby).
            history.node("started", first.address)  # no later than the process starts
            restarted = loop.create_task(first.start(*node_args(etcd, f"n{nodes.index(first)}")))
            await workload.until(killed.at, rng.uniform(0.3, 0.8),
                                 "submit", "complete", "acquire", "fence", "release")
            await restarted
            paused = history.node("paused", second.address)
            second.pause()
            _, probe, epoch = await primary(  # it is replaced while it sleeps
                [node for node in nodes if node is not second], after=epoch)
            await probe.close()
            await asyncio.sleep(paused.at + float(LEASE) + 0.2 - history.now())  # past it
            resumed = history.node("resumed", second.address)
            second.resume()
            assert await second.exited(10) == EXIT_STEPPED_DOWN, second.log()[-2000:]
            await workload.until(resumed.at, rng.uniform(0.3, 0.8), "submit", "complete",
                                 ("acquire", "fence"))  # what the check after it asks
            crashed = await workload.stop()
            assert not crashed, f"clients failed: {crashed} (seed {seed})"
            await workload.final_reads()
    finally:
        if workload is not None:
            await workload.close()
        await kill_all(nodes)
        history.dump(tmp_path / "history.jsonl")  # whatever happened
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, seed) + f"\nhistory: {tmp_path}/history.jsonl")
    _assert_the_workload_went_on_after_each_fault(history, seed)


def _assert_the_workload_went_on_after_each_fault(history: History, seed: int) -> None:
    """Not a rule of the history: a test whose clients did nothing after the faults
    would check nothing. After the kill: every kind of change; after the pause (a short
    while of work before the end): submits, completions, and claims held (a grant or a
    holder's fence check: both keys may be held through that while)."""
    at = {event.kind: event.at for event in history.nodes}
    assert history.final_at is not None
    counts = Counter(f"{op.f} {op.outcome}" for op in history.ops)
    after_kill = done(history, at["killed"], "submit", "complete", "acquire", "fence",
                      "release")
    assert all(after_kill.values()), f"after the kill: {after_kill}; all: {counts} (seed {seed})"
    after_pause = done(history, at["paused"], "submit", "complete", "acquire", "fence")
    assert after_pause["submit"] and after_pause["complete"] and (
        after_pause["acquire"] or after_pause["fence"]), (
        f"after the pause: {after_pause}; all: {counts} (seed {seed})")
