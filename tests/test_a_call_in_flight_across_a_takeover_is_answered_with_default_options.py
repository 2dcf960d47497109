"""A client of a cluster rides through a takeover with its default options (issue 30).

Three rsd nodes and three etcd members, a client given every node's address:

- with the client's options nothing else (connect_timeout 2 s), a call in flight when
  the primary is killed (SIGKILL) is answered by the new primary: the takeover takes
  about the lease, longer than connect_timeout, and the client that was connected
  reconnects for two leases (told in HELLO) plus connect_timeout. It used to raise
  ``UnavailableError: NOT_PRIMARY ... within 2 s``. The cluster lease is 4 s, not rsd's
  default 5, for a takeover sooner that is still longer than connect_timeout whenever
  the primary's last keep-alive was sent: its etcd lease runs out 2/3 of a lease to a
  lease after its pause (keep-alives every third), at least 2.4 s after the kill, 0.3 s
  later, plus the election;
- after SIGSTOP of the primary (it accepts TCP, answers nothing), a client with
  connect_timeout=30 tries the other nodes first: the order of its attempts is checked,
  not how long they took. It used to go back to the silent node first and wait there.
  The order does not depend on the lease's length: the cluster's lease is the shortest
  (2 s), for a takeover sooner, and the client probes its silence in proportion to it, as
  the SDK does to its default 5 s lease (support/cluster.py: ``SILENCE``), so that
  it gives the paused node up about when the takeover is done, not 1 to 2.5 s after.

Real processes: what a fake node cannot show is the real takeover's timing against the
SDK's budget (etcd's lease running out, the election, the promotion). Both tests leave
etcd whole: they share one etcd cluster, each its nodes under a cluster name of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import CLUSTER, SILENCE, kill_all, serving, start_all, sync_named
from support.cluster import LEASE as SHORTEST_LEASE
from support.cluster import primary as primary_of
from support.etcd import EtcdCluster
from support.process import Rsd

from rsclient import AsyncRunstate, connection
from rsclient.connection import DEFAULT_CONNECT_TIMEOUT
from rsclient.nodes import Node

LEASE = "4"  # the cluster lease: a takeover longer than the client's connect_timeout


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd cluster of three for this module's tests."""
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd"), 3).start()
    try:
        yield etcd
    finally:
        etcd.stop()


async def test_a_call_in_flight_when_the_primary_is_killed_is_answered_by_the_new_one(
    tmp_path: Path, shared_etcd: EtcdCluster,
) -> None:
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, lease=LEASE, cluster=f"{CLUSTER}-killed")
        primary, probe, epoch = await primary_of(nodes)
        await probe.close()
        # Only a named synchronous standby may take over: one paused or killed sooner
        # leaves no node allowed to lead (a primary that acknowledged alone).
        await sync_named(primary, nodes)
        rs = AsyncRunstate("planner", ",".join(node.address for node in nodes))
        assert rs._conn.connect_timeout == DEFAULT_CONNECT_TIMEOUT  # the defaults
        await rs.mailboxes.ensure("work", mode="WORK")
        run = await rs.scopes.create()
        mailbox = run.mailbox("work")
        await mailbox.submit({"n": 0}, key="before")
        assert rs._conn.cluster_lease == float(LEASE)  # told in HELLO
        primary.pause()  # the submit below is sent and stays unanswered...
        in_flight = asyncio.ensure_future(mailbox.submit({"n": 1}, key="in-flight"))
        await asyncio.sleep(0.3)
        assert not in_flight.done()
        await primary.kill()  # ... until the primary dies with it
        ticket = await in_flight  # sent again (keyed: safe), answered by the new primary
        survivors = [node for node in nodes if node is not primary]
        _, on_successor, _ = await primary_of(survivors, after=epoch)
        status = await on_successor.scope(run.id).task(ticket.id).status()
        assert status["key"] == "in-flight"
        await on_successor.close()
        await rs.close()
    finally:
        await kill_all(nodes)


async def test_after_sigstop_of_the_primary_the_other_nodes_are_tried_first(
    tmp_path: Path, shared_etcd: EtcdCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "SILENCE_SECONDS", SILENCE)  # (see the docstring)
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, lease=SHORTEST_LEASE, cluster=f"{CLUSTER}-paused")
        # (its synchronous standby named, so that a standby may take over: above)
        primary = await serving(etcd, nodes, lease=SHORTEST_LEASE, cluster=f"{CLUSTER}-paused")
        rs = AsyncRunstate("planner", ",".join(node.address for node in nodes),
                           connect_timeout=30)
        await rs.ping()
        conn = rs._conn
        tried: list[str] = []
        opened = conn._open

        async def recording(node: Node) -> None:
            tried.append(str(node))
            await opened(node)

        monkeypatch.setattr(conn, "_open", recording)
        primary.pause()
        assert "time" in await rs.ping()  # given up for its silence, sent again
        assert tried, "the client never reconnected"
        assert tried[0] != primary.address, tried  # not back to the silent node first
        assert tried[-1] != primary.address  # answered by another node
        await rs.close()
    finally:
        for node in nodes:
            if node.alive:
                node.resume()
        await kill_all(nodes)
