"""Three rsd nodes over an etcd cluster, for the tests that fail nodes under load.

``start_all`` starts node ``n<i>`` for ``nodes[i]`` (``--fsync always``, the cluster lease
``LEASE``), ``kill_all`` kills what is left at the end of a test, ``primary`` waits for
the node that leads an epoch above a given one (its log says so) and gives a client of
it, and ``watch_primaries`` calls back each time a node's log first says it leads an
epoch (for a history: support/history.py); ``sync_named`` waits for the primary to name
a synchronous standby and gives that node; ``a_standby_about_to_hang`` gives three nodes
at rsd's default lease, a client with the SDK's defaults and the synchronous standby to
stop. ``SILENCE`` is the SDK's silence probe scaled
to these clusters' lease, for tests whose clients must leave a silent primary
(``monkeypatch.setattr(rsclient.connection, "SILENCE_SECONDS", SILENCE)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rsclient import AsyncRunstate
from rsclient.client import Scope
from rsclient.events import ConnectionEvent
from rsclient.mailboxes import Mailbox
from rsd.cluster.options import LEASE_SECONDS
from rsproto import sdkrules

from .etcd import EtcdCluster
from .process import Rsd

__all__ = ["CLUSTER", "LEASE", "SILENCE", "StandbyAboutToHang", "a_standby_about_to_hang",
           "kill_all", "named_syncs", "node_args", "primary", "serving",
           "start_all", "sync_named", "watch_primaries"]

LEASE = "2"  # --cluster-lease-seconds: a takeover within about 2 s
CLUSTER = "fault"
# The SDK probes a connection silent for SILENCE_SECONDS (1.5 s) with a PING and gives it
# up as long again later: about when a standby takes over from a primary paused or cut
# off, at rsd's default 5 s cluster lease. Scaled to LEASE: 0.6 s (given up after 1.2 s).
SILENCE = sdkrules.SILENCE_SECONDS * float(LEASE) / sdkrules.DEFAULT_CLUSTER_LEASE_SECONDS
_LEADS = re.compile(r"is the primary \(epoch (\d+)\)")


def node_args(etcd: EtcdCluster, name: str, lease: str = LEASE,
              cluster: str = CLUSTER) -> list[str]:
    """The flags of node ``name`` of cluster ``cluster`` (tests that share one etcd
    cluster give each of theirs a name of its own)."""
    return ["--etcd", ",".join(etcd.endpoints), "--cluster", cluster, "--node", name,
            "--cluster-lease-seconds", lease, "--fsync", "always"]


async def start_all(etcd: EtcdCluster, nodes: Sequence[Rsd], *extra: str,
                    lease: str = LEASE, cluster: str = CLUSTER) -> None:
    """Start every node (node ``n<i>`` for ``nodes[i]``) at once."""
    await asyncio.gather(*(node.start(*node_args(etcd, f"n{i}", lease, cluster), *extra)
                           for i, node in enumerate(nodes)))


async def kill_all(nodes: Sequence[Rsd]) -> None:
    """Kill every node still running (the end of each test, whatever happened)."""
    for node in nodes:
        if node.alive:
            with contextlib.suppress(Exception):
                await node.kill()


def epochs_led(node: Rsd) -> list[int]:
    """The epochs the node's current process says it leads, in order."""
    return [int(epoch) for epoch in _LEADS.findall(node.log())]


async def primary(nodes: Sequence[Rsd], after: int = 0, timeout: float = 15.0,
                  tls: ssl.SSLContext | None = None) -> tuple[Rsd, AsyncRunstate, int]:
    """The node that leads an epoch above ``after`` (its log says so), a client of it
    (its address alone), and the epoch."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for node in nodes:
            if not node.alive:
                continue
            found = epochs_led(node)
            if found and found[-1] > after:
                rs = AsyncRunstate(holder="probe", address=node.address, connect_timeout=5,
                                   tls=tls)
                return node, rs, found[-1]
        assert loop.time() < deadline, "no primary came: " + "\n".join(
            node.log()[-2000:] for node in nodes)
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def watch_primaries(nodes: Sequence[Rsd], seen: Callable[[Rsd, int], None],
                          every: float = 0.02) -> AsyncIterator[None]:
    """While the block runs, ``seen(node, epoch)`` once for each epoch a node's log
    says it leads, soon after it says so (never before)."""
    told: set[tuple[str, int]] = set()

    async def poll() -> None:
        while True:
            for node in nodes:
                if node.proc is None or not node.logs:
                    continue
                for epoch in epochs_led(node):
                    if (node.address, epoch) not in told:
                        told.add((node.address, epoch))
                        seen(node, epoch)
            await asyncio.sleep(every)

    task = asyncio.get_running_loop().create_task(poll())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


_NAMED = re.compile(r"cluster \S+: (\S+) is named the synchronous standby")


def named_syncs(log: str) -> list[str]:
    """The nodes a node's ``log`` says it named the synchronous standby, in order."""
    return _NAMED.findall(log)


async def sync_named(primary: Rsd, nodes: Sequence[Rsd], after: int = 0,
                     timeout: float = 30.0) -> Rsd:
    """The node ``primary`` names the synchronous standby once its log has more than
    ``after`` such namings (it leads and a standby has caught up), of ``nodes`` (node
    ``n<i>`` is ``nodes[i]``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(found := named_syncs(primary.log())) <= after:
        assert loop.time() < deadline and primary.alive, (
            "no synchronous standby named:\n" + primary.log()[-3000:])
        await asyncio.sleep(0.05)
    return nodes[int(found[-1].removeprefix("n"))]


STEPPED_DOWN = 75  # rsd's exit when its leadership may have lapsed (a supervisor restarts it)


async def serving(etcd: EtcdCluster, nodes: Sequence[Rsd], *, lease: str = LEASE,
                  cluster: str = CLUSTER, tries: int = 3) -> Rsd:
    """The primary of ``nodes`` (started by ``start_all``) once it has named its
    synchronous standby: a cluster that serves, for a test's faults to begin from. A
    primary that steps down before (a loaded machine's stall can outlast the 2 s lease's
    deadline: it exits 75, as it must; seen once in a CI-like run, a 517 ms stall 1.5 s
    after the election) is started again, as its supervisor would, and the next one is
    waited for."""
    after = 0
    for _ in range(tries):
        found, probe, after = await primary(nodes, after=after)
        await probe.close()
        try:
            await sync_named(found, nodes)
            return found
        except AssertionError:
            if found.alive or found.proc is None or found.proc.poll() != STEPPED_DOWN:
                raise
        await found.start(*node_args(etcd, f"n{nodes.index(found)}", lease, cluster))
    raise AssertionError(f"{tries} primaries in a row stepped down before they served")


@dataclass
class StandbyAboutToHang:
    """What ``a_standby_about_to_hang`` gives: ``hung`` is still running."""

    nodes: list[Rsd]
    primary: Rsd
    epoch: int
    hung: Rsd  # the synchronous standby the primary named last
    namings: int  # how many namings the primary's log held before the hang
    client: AsyncRunstate  # the SDK's defaults, given every node
    events: list[ConnectionEvent]  # the client's connection events
    run: Scope
    mailbox: Mailbox  # a WORK mailbox "work" of ``run``


@contextlib.asynccontextmanager
async def a_standby_about_to_hang(
    tmp_path: Path, etcd: EtcdCluster, holder: str
) -> AsyncIterator[StandbyAboutToHang]:
    """Three nodes at rsd's default cluster lease (the stream's deadline too: how long a
    hung synchronous standby holds writes), the primary's synchronous standby named, and a
    client of the SDK's defaults with a fresh run: what the hung-standby tests begin with.
    The client is closed and every node killed afterwards."""
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    client: AsyncRunstate | None = None
    try:
        await start_all(etcd, nodes, lease=str(LEASE_SECONDS))
        first, probe, epoch = await primary(nodes)
        await probe.close()
        await sync_named(first, nodes)
        client = AsyncRunstate(holder, ",".join(node.address for node in nodes))
        events: list[ConnectionEvent] = []
        client.on_connection_event(events.append)
        await client.mailboxes.ensure("work", mode="WORK")
        run = await client.scopes.create()
        namings = len(named_syncs(first.log()))
        hung = await sync_named(first, nodes, after=namings - 1)  # the one named last
        yield StandbyAboutToHang(nodes, first, epoch, hung, namings, client, events, run,
                                 run.mailbox("work"))
    finally:
        if client is not None:
            await client.close()
        await kill_all(nodes)
