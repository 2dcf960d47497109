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

Faults 1 and 2 are made on one cluster and faults 3 and 4 on another, one after the
other (each on a network of its own, with a workload of its own: the halves are
independent; at once, they starved a 2 s-lease primary of its keep-alives under the
suite's load). Each whole history (support/history.py)
keeps every rule: no acknowledged change lost, never two live holders of one claim, one
result per task, stale tokens refused, no reply from a replaced primary; and after each
fault the cluster acknowledged changes again. How long it acknowledged none around each
cut is printed (``partition ...`` lines), not asserted. Skipped, saying why, where network
namespaces cannot be made (not root, no CAP_NET_ADMIN). ``RSD_HISTORY_SEED`` runs a seed
again (the second cluster's workload draws from the seed ^ 2).

Through faults 3 and 4 the clients probe a silent connection in proportion to the 2 s
cluster lease, as the SDK does to its default 5 s (support/cluster.py: ``SILENCE``): they
leave the isolated primary about when a standby has taken over, not 1 to 2.5 s later, and
keep a primary that holds their writes for a new synchronous standby (a PING's reply
leaves ahead of its connection's held replies: rsd/wire/output.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import netns
from support.cluster import LEASE, SILENCE, sync_named
from support.history import check, report
from support.netns import Host
from support.partitions import PartitionedCluster, each_on_a_cluster
from support.workload import done

from rsclient import connection

HOLD = 2 * float(LEASE)  # the clients' cut: past the cluster lease, within a claim's
Acknowledged = dict[str, dict[str, int]]  # fault -> function -> changes acknowledged after


@contextlib.contextmanager
def _silence_in_proportion() -> Iterator[None]:
    """Within the block, the clients probe a silent connection after ``SILENCE`` (the
    module docstring)."""
    sdk = connection.SILENCE_SECONDS
    connection.SILENCE_SECONDS = SILENCE
    try:
        yield
    finally:
        connection.SILENCE_SECONDS = sdk


async def _cut_from_etcd_then_from_its_clients(cluster: PartitionedCluster,
                                              rng: random.Random) -> Acknowledged:
    """Faults 1 and 2."""
    history, workload = cluster.history, cluster.workload
    acknowledged_after: Acknowledged = {}
    await asyncio.sleep(rng.uniform(0.5, 1.0))

    # 1. The primary cut from etcd: a standby takes over; the primary steps down.
    first = cluster.leader
    assert first is not None
    etcd = cluster.net["etcd"].address
    cut = cluster.cut("of the primary from etcd", first, lambda host: host.block(etcd))
    await cluster.primary(among=cluster.standbys(first))
    await workload.until(cut.event.at, rng.uniform(0.3, 0.8), "submit", "complete",
                         at_most=10)
    acknowledged_after[cut.what] = done(history, cut.event.at, "submit", "complete",
                                        until=history.now())
    cluster.heal(cut)
    await cluster.stepped_down(first)

    # 2. The primary cut from its clients: nobody takes over; the clients go on once it
    # heals.
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
    return acknowledged_after


async def _isolate_the_standby_then_the_primary(cluster: PartitionedCluster,
                                               rng: random.Random) -> Acknowledged:
    """Faults 3 and 4."""
    history, workload = cluster.history, cluster.workload
    acknowledged_after: Acknowledged = {}
    await asyncio.sleep(rng.uniform(0.5, 1.0))

    with _silence_in_proportion():  # (each client's next probe is the first this short)
        # 3. The synchronous standby isolated: the primary names the other one.
        third = cluster.leader
        assert third is not None
        await sync_named(third, cluster.nodes)
        await cluster.copies(third)  # (the other standby too: it is to be named next)
        standby = cluster.sync_standby(third)
        assert standby is not None, f"{third} named no synchronous standby:\n{third.log()}"
        cut = cluster.cut("of the synchronous standby, isolated", standby, Host.isolate)
        async with cluster.supervised([node for node in cluster.nodes if node is not standby]):
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
    return acknowledged_after


async def test_a_cluster_cut_apart_by_its_network_breaks_no_rule(tmp_path: Path) -> None:
    netns.require()
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    halves = await each_on_a_cluster(tmp_path, seed, _cut_from_etcd_then_from_its_clients,
                           _isolate_the_standby_then_the_primary)
    for (history, acknowledged_after), where in zip(halves, "ab", strict=True):
        violations = check(history)
        if violations:
            pytest.fail(report(history, violations, seed)
                        + f"\nhistory: {tmp_path / where}/history.jsonl")
        counts = Counter(f"{op.f} {op.outcome}" for op in history.ops)
        went_on = {what: counts for what, counts in acknowledged_after.items()
                   if not all(counts.values())}
        assert not went_on, (f"no change acknowledged after: {went_on}; all: {counts} "
                             f"(seed {seed})\n" + report(history, [], seed))
