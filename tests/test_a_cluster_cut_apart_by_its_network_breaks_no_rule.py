"""A three-node cluster (``--fsync always``, a 2 s cluster lease), each node in a network
namespace of its own and etcd in another (support/netns.py), cut apart as a network
fails, one fault after the other, under the recorded workload (support/workload.py):

1. the primary cut from etcd (both ways): it must stop answering before its etcd lease
   could have lapsed (it steps down: exit 75) and a standby takes over;
2. the primary cut from its clients (both ways; it still reaches etcd and its standbys):
   it keeps leading, and the clients go on once the cut heals;
3. the synchronous standby isolated (every packet, both ways): the primary names the
   other standby and acknowledges changes again while the cut holds;
4. the primary isolated: as 1, and its clients cannot reach it either.

The whole history (support/history.py) keeps every rule: no acknowledged change lost,
never two live holders of one claim, one result per task, stale tokens refused, no
reply from a replaced primary; and after each fault the cluster acknowledged changes
again. How long it acknowledged none around each cut is printed (``partition ...``
lines), not asserted. Skipped, saying why, where network namespaces cannot be made (not
root, no CAP_NET_ADMIN). ``RSD_HISTORY_SEED`` runs a seed again.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from support import netns
from support.cluster import LEASE
from support.history import check, report
from support.netns import Host
from support.partitions import partitioned_cluster
from support.workload import done

HOLD = 2 * float(LEASE)  # the clients' cut: past the cluster lease, within a claim's


async def test_a_cluster_cut_apart_by_its_network_breaks_no_rule(tmp_path: Path) -> None:
    netns.require()
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed ^ 1)
    acknowledged_after: dict[str, dict[str, int]] = {}
    async with partitioned_cluster(tmp_path, seed) as cluster:
        history, workload = cluster.history, cluster.workload
        await asyncio.sleep(rng.uniform(0.5, 1.0))

        # 1. The primary cut from etcd: a standby takes over; the primary steps down.
        first = cluster.leader
        assert first is not None
        etcd = cluster.net["etcd"].address
        cut = cluster.cut("of the primary from etcd", first,
                          lambda host: host.block(etcd))
        await cluster.primary(among=cluster.standbys(first))
        await workload.until(cut.event.at, rng.uniform(0.3, 0.8), "submit", "complete",
                             at_most=10)
        acknowledged_after[cut.what] = done(history, cut.event.at, "submit", "complete",
                                            until=history.now())
        cluster.heal(cut)
        await cluster.stepped_down(first)

        # 2. The primary cut from its clients: nobody takes over; the clients go on
        # once it heals.
        second = cluster.leader
        assert second is not None
        cut = cluster.cut("of the primary from its clients", second,
                          lambda host: host.block(cluster.net.client))
        await asyncio.sleep(HOLD)
        healed = cluster.heal(cut)
        await workload.until(healed.at, rng.uniform(0.3, 0.8), "submit", "complete",
                             at_most=20)
        acknowledged_after[cut.what] = done(history, healed.at, "submit", "complete",
                                            until=history.now())
        await cluster.restart(second)  # (if it stepped down meanwhile)

        # 3. The synchronous standby isolated: the primary names the other one.
        third = cluster.leader
        assert third is not None
        standby = cluster.sync_standby(third)
        assert standby is not None, f"{third} named no synchronous standby:\n{third.log()}"
        cut = cluster.cut("of the synchronous standby, isolated", standby, Host.isolate)
        await workload.until(cut.event.at, rng.uniform(0.3, 0.8), "submit", "complete",
                             at_most=20)
        acknowledged_after[cut.what] = done(history, cut.event.at, "submit", "complete",
                                            until=history.now())
        cluster.heal(cut)
        await cluster.restart(standby)  # (if it stepped down meanwhile)

        # 4. The primary isolated: a standby takes over; the primary steps down.
        await workload.until(history.now(), rng.uniform(0.3, 0.8), "submit", "complete")
        fourth = cluster.leader
        assert fourth is not None
        cut = cluster.cut("of the primary, isolated", fourth, Host.isolate)
        await cluster.primary(among=cluster.standbys(fourth))
        await workload.until(cut.event.at, rng.uniform(0.3, 0.8), "submit", "complete",
                             at_most=10)
        acknowledged_after[cut.what] = done(history, cut.event.at, "submit", "complete",
                                            until=history.now())
        cluster.heal(cut)
        await cluster.stepped_down(fourth)

        crashed = await workload.stop()
        cluster.report()
        assert not crashed, f"clients failed: {crashed} (seed {seed})"
        await workload.final_reads()
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, seed) + f"\nhistory: {tmp_path}/history.jsonl")
    counts = Counter(f"{op.f} {op.outcome}" for op in history.ops)
    went_on = {what: counts for what, counts in acknowledged_after.items()
               if not all(counts.values())}
    assert not went_on, (f"no change acknowledged after: {went_on}; all: {counts} "
                         f"(seed {seed})\n" + report(history, [], seed))
