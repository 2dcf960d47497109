"""A three-node cluster on a network of namespaces (support/netns.py), under the
recorded workload (support/workload.py), for the tests that cut it apart.

``partitioned_cluster(root, seed)`` makes a ``Network`` with a host per rsd node
(``n0``..``n2``) and one for the three etcd members (``etcd``), starts etcd there and
each node in its own host (``--insecure``: the nodes listen on their host's address, not
loopback, on a network nothing else reaches), and sets the workload going from the test
process (the root namespace, on the bridge: the clients' one address is
``net.client``). On the way out, whatever happened: the workload is closed, the nodes
and etcd killed, the network removed, the history written (``history.jsonl``).

Why the clients run in the test process, not in a namespace of their own: the history
is recorded in-process, each op on the history's one clock with the node that answered
it (support/history.py watches the SDK's connection), which a client in a helper process
would have to send back; and the root namespace's one address on the bridge is the
clients' alone (etcd and every node have their own), so "a node cut from its clients"
is a cut of that address, made on the node's side like every other.

A test's faults are ``cut(what, node, rule)`` (records a ``cut`` event, runs the nft
rule on the node's host) and ``heal(cut)`` (ends every rule of the host, records
``healed``); ``report`` prints how long the cluster acknowledged no change during each
cut; ``restart`` starts a node that stepped down again, as its supervisor would.

``each_on_a_cluster(root, seed, *parts)`` runs each part (a sequence of faults) on a
cluster of its own (``root/a``, ``root/b``...), one after another, each to its final
reads (not at once: see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .cluster import LEASE, kill_all, node_args, primary, watch_primaries
from .etcd import EtcdCluster
from .history import History, NodeEvent
from .netns import Host, Network
from .process import Rsd
from .workload import Workload, unavailability

__all__ = ["EXIT_STEPPED_DOWN", "NODES", "Cut", "PartitionedCluster", "each_on_a_cluster",
           "partitioned_cluster"]

NODES = 3
EXIT_STEPPED_DOWN = 75  # rsd/replication/node.py: leadership may have lapsed; start again
_SYNC = re.compile(r": (\S+) is named the synchronous standby")
T = TypeVar("T")


@dataclass
class Cut:
    """One fault: what was cut, on which host, since when (the ``cut`` event)."""

    what: str
    host: Host
    event: NodeEvent
    epoch: int  # the epoch led when it began
    healed: float | None = None  # when it ended


class PartitionedCluster:
    """The cluster, its network and its history (see the module docstring)."""

    def __init__(self, net: Network, etcd: EtcdCluster, nodes: list[Rsd], history: History,
                 workload: Workload) -> None:
        self.net = net
        self.etcd = etcd
        self.nodes = nodes
        self.history = history
        self.workload = workload
        self.epoch = 0  # the last epoch a node was seen to lead
        self.leader: Rsd | None = None  # the node seen to lead it
        self.cuts: list[Cut] = []

    def host(self, node: Rsd) -> Host:
        return self.net[self.name(node)]

    def name(self, node: Rsd) -> str:
        return f"n{self.nodes.index(node)}"

    def node(self, name: str) -> Rsd:
        return self.nodes[int(name.removeprefix("n"))]

    async def primary(self, among: list[Rsd] | None = None, timeout: float = 15.0) -> Rsd:
        """The node that leads an epoch above the last one seen (among ``among``)."""
        node, probe, self.epoch = await primary(among or self.nodes, after=self.epoch,
                                                timeout=timeout)
        await probe.close()
        self.leader = node
        return node

    def sync_standby(self, node: Rsd) -> Rsd | None:
        """The synchronous standby that primary ``node`` named last (its log says so)."""
        named = _SYNC.findall(node.log())
        return self.node(named[-1]) if named else None

    def standbys(self, node: Rsd) -> list[Rsd]:
        return [other for other in self.nodes if other is not node]

    async def copies(self, primary: Rsd, timeout: float = 30.0) -> None:
        """Until every other node follows ``primary`` (its log says each has its copy, or
        resumes after a batch it holds): a standby still taking its copy could not
        replace the synchronous one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        names = [self.name(node) for node in self.standbys(primary)]
        while not all(f"standby {name} has its copy" in (text := primary.log())
                      or f"standby {name} resumes after batch" in text for name in names):
            assert loop.time() < deadline and primary.alive, (
                "the standbys did not get their copy:\n" + primary.log()[-3000:])
            await asyncio.sleep(0.05)

    def cut(self, what: str, node: Rsd, rule: Callable[[Host], None]) -> Cut:
        """Cut ``node``'s host by ``rule`` (``Host.block`` or ``isolate``), now."""
        event = self.history.node("cut", node.address)
        rule(self.host(node))
        cut = Cut(what, self.host(node), event, self.epoch)
        self.cuts.append(cut)
        return cut

    def heal(self, cut: Cut) -> NodeEvent:
        """End the cut (every rule of its host)."""
        cut.host.heal()
        healed = self.history.node("healed", cut.event.node)
        cut.healed = healed.at
        return healed

    def report(self) -> None:
        """Print, for each cut, the longest stretch without an acknowledged change that
        overlaps it (the tests assert the rules, not timings)."""
        for cut in self.cuts:
            end = cut.healed if cut.healed is not None else self.history.now()
            began, ended = unavailability(self.history, cut.event.at, end)
            gap = f"{ended - began:.2f} s" if ended != float("inf") else "ever after"
            led = [event for event in self.history.nodes if event.kind == "primary"
                   and (event.epoch or 0) > cut.epoch and event.at >= cut.event.at]
            takeover = (f"epoch {led[0].epoch} seen led {led[0].at - cut.event.at:.2f} s "
                        "after the cut" if led and led[0].at <= end else
                        f"epoch {cut.epoch} led throughout")
            print(f"partition {cut.what}: cut from {cut.event.at:.2f} s to {end:.2f} s "
                  f"({end - cut.event.at:.2f} s); no change acknowledged for {gap} (from "
                  f"{began:.2f} s to {ended:.2f} s); {takeover}", flush=True)

    async def restart(self, node: Rsd) -> None:
        """Start ``node`` again if it stepped down (exit 75; any other exit fails the
        test), as its supervisor would: it comes back as a standby."""
        if node.alive:
            return
        code = await node.exited(0)
        assert code == EXIT_STEPPED_DOWN, f"{node} exited {code}:\n{node.log()[-3000:]}"
        self.history.node("started", node.address)  # no later than the process starts
        await node.start(*node_args(self.etcd, self.name(node)), "--insecure")

    @contextlib.asynccontextmanager
    async def supervised(self, nodes: list[Rsd]) -> AsyncIterator[None]:
        """Within the block a node of ``nodes`` that steps down (exit 75) is started
        again at once, as its supervisor would (systemd's Restart=on-failure): a primary
        starved of its etcd keep-alives on a loaded machine steps down, and a cluster
        whose only other node is cut off then acknowledges nothing until it is back."""
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                for node in nodes:
                    if not node.alive:
                        await self.restart(node)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

        watching = asyncio.ensure_future(watch())
        try:
            yield
        finally:
            stop.set()
            await watching  # (a restart under way ends first; a bad exit fails the test)

    async def stepped_down(self, node: Rsd, timeout: float = 10.0) -> None:
        """Wait until ``node`` exits (it must step down: exit 75), then start it again."""
        code = await node.exited(timeout)
        assert code == EXIT_STEPPED_DOWN, f"{node} exited {code}:\n{node.log()[-3000:]}"
        await self.restart(node)


@contextlib.asynccontextmanager
async def partitioned_cluster(root: Path, seed: int) -> AsyncIterator[PartitionedCluster]:
    """A started cluster on a network of namespaces, its workload running (see the
    module docstring)."""
    net = Network(["etcd", *(f"n{i}" for i in range(NODES))])
    history = History(float(LEASE))
    nodes: list[Rsd] = []
    etcd: EtcdCluster | None = None
    workload: Workload | None = None
    try:
        # (in a thread each: another cluster of the test may be starting meanwhile)
        await asyncio.to_thread(net.start)
        etcd = await asyncio.to_thread(EtcdCluster(root / "etcd", 3, host=net["etcd"].address,
                                                   wrap=net["etcd"].command()).start)
        nodes = [Rsd(root / f"n{i}", listen_host=net[f"n{i}"].address,
                     netns=net[f"n{i}"].netns) for i in range(NODES)]
        await asyncio.gather(*(node.start(*node_args(etcd, f"n{i}"), "--insecure")
                               for i, node in enumerate(nodes)))
        for node in nodes:
            history.node("started", node.address)
        workload = Workload(history, ",".join(node.address for node in nodes),
                            random.Random(seed))
        cluster = PartitionedCluster(net, etcd, nodes, history, workload)

        def seen(node: Rsd, epoch: int) -> None:
            history.node("primary", node.address, epoch)

        async with watch_primaries(nodes, seen):
            await cluster.primary()
            await workload.start()
            yield cluster
    finally:
        try:
            if workload is not None:
                await workload.close()
            await kill_all(nodes)
            if etcd is not None:
                etcd.stop()
        finally:
            net.close()  # (it ends whatever is left in the namespaces)
            history.dump(root / "history.jsonl")



async def each_on_a_cluster(
    root: Path, seed: int,
    *parts: Callable[[PartitionedCluster, random.Random], Awaitable[T]],
) -> list[tuple[History, T]]:
    """Each part on a cluster of its own (``root/a``, ``root/b``...; the workload's
    randomness from ``seed``, ``seed ^ 2``...; the part's own from that ^ 1), one after
    another; when a part returns, its workload stops (no client may have crashed) and
    reads every acknowledged change on the final primary. Each part's history and what
    it returned, in order.

    One at a time, not at once: two clusters (three nodes and three etcd members each)
    beside the suite's other workers starved a primary of its 2 s lease's keep-alives
    (seen twice in full runs: it stepped down 1.2 s after its synchronous standby was
    cut, and the only node that might take over was the isolated one, so nothing was
    acknowledged until the cut healed)."""
    results: list[tuple[History, T]] = []
    for i, part in enumerate(parts):
        where, own = chr(ord("a") + i), seed ^ (2 * i)
        async with partitioned_cluster(root / where, own) as cluster:
            found = await part(cluster, random.Random(own ^ 1))
            crashed = await cluster.workload.stop()
            cluster.report()
            assert not crashed, f"clients failed: {crashed} (seed {own}, {root / where})"
            await cluster.workload.final_reads()
        results.append((cluster.history, found))
    return results
