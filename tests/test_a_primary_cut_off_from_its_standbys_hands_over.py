"""A primary cut off from every standby but not from etcd must not keep leading while it
can acknowledge nothing (issue 30, item 3): the synchronous standby on the other side
holds every acknowledged change, and one of the standbys takes over.

A three-node cluster (``--fsync always``, a 2 s cluster lease), each node in a network
namespace of its own and etcd in another (support/netns.py), under the recorded workload
(support/workload.py), one fault after the other:

1. the primary cut from both standbys, both ways;
2. the next primary's standbys' acknowledgements dropped (acks only: every packet from
   a standby to the primary's port, the stream's TCP acknowledgements too).

Each time, while the cut holds, a standby leads a new epoch and the cluster acknowledges
changes again; the cut primary steps down (exit 75) and, started again after the cut
heals, comes back as a standby. The whole history (support/history.py) keeps every rule:
nothing acknowledged is lost, one live holder per claim, one result per task, stale
tokens refused, no reply from a replaced primary. How long the cluster acknowledged no
change during each cut is printed (``partition ...`` lines), not asserted. Skipped,
saying why, where network namespaces cannot be made. ``RSD_HISTORY_SEED`` runs a seed
again.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from support import netns
from support.history import check, report
from support.netns import Host
from support.partitions import Cut, PartitionedCluster, partitioned_cluster
from support.process import Rsd
from support.workload import done

# How long a standby may take to lead while the cut holds: a bound for a test that must
# end, far above the target (2 x the cluster lease + 1 s), not a timing asserted.
TAKEOVER_WITHIN = 20.0


async def _handed_over(cluster: PartitionedCluster, cut: Cut, old: Rsd) -> dict[str, int]:
    """While ``cut`` holds: a standby leads a new epoch and the cluster acknowledges
    changes again; then the cut heals and ``old`` (which must have stepped down: exit
    75) starts again. The changes acknowledged after the takeover, before the heal."""
    try:
        await cluster.primary(among=cluster.standbys(old), timeout=TAKEOVER_WITHIN)
    except AssertionError:
        cluster.heal(cut)
        cluster.report()
        pytest.fail(f"no standby took over within {TAKEOVER_WITHIN:.0f} s of the cut "
                    f"{cut.what}; the cut primary {old} still leads, acknowledging nothing "
                    f"(issue 30, item 3). Its log:\n{old.log()[-3000:]}")
    took_over = cluster.history.now()
    await cluster.workload.until(took_over, 0.5, "submit", "complete", at_most=10)
    acknowledged = done(cluster.history, took_over, "submit", "complete",
                        until=cluster.history.now())
    cluster.heal(cut)
    await cluster.stepped_down(old)
    return acknowledged


async def test_a_primary_cut_off_from_its_standbys_hands_over(tmp_path: Path) -> None:
    netns.require()
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed ^ 1)
    acknowledged_after: dict[str, dict[str, int]] = {}
    async with partitioned_cluster(tmp_path, seed) as cluster:
        history, workload = cluster.history, cluster.workload
        await asyncio.sleep(rng.uniform(0.5, 1.0))

        # 1. Both ways: the primary and its standbys hear nothing from each other.
        first = cluster.leader
        assert first is not None
        standbys = [cluster.host(node).address for node in cluster.standbys(first)]
        cut = cluster.cut("of the primary from its standbys, both ways", first,
                          lambda host: host.block(*standbys))
        acknowledged_after[cut.what] = await _handed_over(cluster, cut, first)
        await workload.until(history.now(), rng.uniform(0.3, 0.8), "submit", "complete")

        # 2. Acks only: what the standbys send the primary is lost; its stream is not.
        second = cluster.leader
        assert second is not None
        standbys = [cluster.host(node).address for node in cluster.standbys(second)]
        port = second.port

        def acks_only(host: Host) -> None:
            host.block(*standbys, outbound=False, port=port)

        cut = cluster.cut("of the standbys' acknowledgements to the primary", second,
                          acks_only)
        acknowledged_after[cut.what] = await _handed_over(cluster, cut, second)

        crashed = await workload.stop()
        cluster.report()
        assert not crashed, f"clients failed: {crashed} (seed {seed})"
        await workload.final_reads()
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, seed) + f"\nhistory: {tmp_path}/history.jsonl")
    counts = Counter(f"{op.f} {op.outcome}" for op in history.ops)
    idle = {what: after for what, after in acknowledged_after.items()
            if not all(after.values())}
    assert not idle, (f"no change acknowledged after the takeover: {idle}; all: {counts} "
                      f"(seed {seed})\n" + report(history, [], seed))
