"""Write-unavailability of a three-node cluster through two faults that kill no process:
a hung synchronous standby, and a primary cut off from its standbys but not from etcd.

Starts 3 etcd members and 3 rsd nodes as ``bench.cluster`` does (``--fsync always``,
``--cluster-lease-seconds`` 5 by default), each node advertising the address of a TCP
proxy of its own (the address its standbys follow; the client is given the nodes' own
addresses, the primary's first). One client submits keyed tasks one after another
(``bench.cluster``'s ``Submitter``). Then:

1. the synchronous standby (the one the primary's log named last) is stopped (SIGSTOP)
   for ``--pause`` seconds, then continued (SIGCONT);
2. the primary's proxy cuts its standbys' streams for ``--cut`` seconds (it drops
   everything both ways on them and keeps their connections open: the primary is cut
   off from every standby, not from etcd nor from its clients), then heals them; a node
   that exits meanwhile is started again at once, as its supervisor would.

For each, the figure is the longest time without an acknowledged write, from the fault
to a few seconds after it ended (the gaps between consecutive acknowledgements, the
fault's start counting as one). The client is given the first primary's own address
first, so that it writes to it directly, as a client on the primary's side of the cut
would, and what the cluster did (from the nodes' logs). At the
end a sample of the acknowledged submits is read back on the last primary.

    python -m bench.cluster_faults [--lease-seconds 5] [--pause 8] [--cut 12] [--logs DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.cluster import (
    DEFAULT_LEASE,
    VERIFY_SAMPLE,
    Cluster,
    Node,
    Submitter,
    Takeovers,
    running_cluster,
    say,
)

__all__ = ["Fault", "measure"]

SETTLE_SECONDS = 3.0  # after a fault ends: the writes it held are released or refused
_NAMED = re.compile(r": (\S+) is named the synchronous standby")


class Proxy:
    """Forwards every connection to ``target``; while cut, the standbys' streams (their
    HELLO, the first thing the client side sends, asks to ``replicate``) are a black
    hole: what either side sends is dropped, nothing is refused. Other connections (a
    client sent on by a standby) pass. (tests/support/proxy.py is the tests' one; the
    bench installs no test code.)"""

    def __init__(self) -> None:
        self.target = ("127.0.0.1", 0)
        self.cut_off = False
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            first = await reader.read(1 << 16)
            replica = b"replicate" in first
            if self.cut_off and replica:
                while await reader.read(1 << 16):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            up_writer.write(first)
            await asyncio.gather(self._pipe(reader, up_writer, replica),
                                 self._pipe(up_reader, writer, replica))
        except OSError:
            pass
        finally:
            writer.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    replica: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(1 << 16):
                if not (self.cut_off and replica):
                    sink.write(data)
                    await sink.drain()
        sink.close()


class ProxiedCluster(Cluster):
    """``bench.cluster``'s cluster, each node advertising its own proxy's address."""

    def __init__(self, root: Path, lease: int) -> None:
        super().__init__(root, lease)
        self.proxies = {node.name: Proxy() for node in self.nodes}

    def args(self, node: Node) -> list[str]:
        return [*super().args(node), "--advertise", self.proxies[node.name].address]

    async def start(self) -> None:
        for proxy in self.proxies.values():
            await proxy.start()
        await super().start()
        for node in self.nodes:
            self.proxies[node.name].target = ("127.0.0.1", node.port)

    async def stop(self) -> None:
        await super().stop()
        for proxy in self.proxies.values():
            await proxy.close()


@dataclass
class Fault:
    what: str
    seconds: float  # how long the fault lasted
    unavailable: float  # the longest time without an acknowledged write, from the fault on
    first_ack: float | None  # from the fault to the first acknowledged write sent after it
    events: list[str] = field(default_factory=list)  # what the nodes' logs say happened


def _longest_gap(acks: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest time within [start, end] without an acknowledgement."""
    answered = sorted(at for _, at in acks if start < at <= end)
    points = [start, *answered, end]
    return max(later - earlier for earlier, later in itertools.pairwise(points))


def _since(node: Node, mark: int, pattern: str) -> list[str]:
    """Lines of ``node``'s log after character ``mark`` that match ``pattern``."""
    return [line[:220] for line in node.log()[mark:].splitlines() if re.search(pattern, line)]


async def _fault(cluster: ProxiedCluster, submitter: Submitter, what: str, seconds: float,
                 begin: Callable[[], None], end: Callable[[], None]) -> Fault:
    """Run one fault (``begin()`` then, ``seconds`` later, ``end()``) under the submitter;
    nodes that exit meanwhile are started again."""
    primary, _ = await cluster.primary()
    await cluster.copies(primary)
    if await submitter.first_ack_after(time.monotonic(), 10) is None:
        raise RuntimeError(f"before {what}: nothing acknowledged for 10 s")
    marks = {node.name: (len(node.logs), len(node.log())) for node in cluster.nodes}
    start = time.monotonic()
    begin()
    while time.monotonic() - start < seconds:
        await cluster.revive()
        await asyncio.sleep(0.1)
    end()
    ended = time.monotonic()
    while time.monotonic() - ended < SETTLE_SECONDS:
        await cluster.revive()
        await asyncio.sleep(0.1)
    first = await submitter.first_ack_after(start, 60)
    unavailable = _longest_gap(submitter.acks, start, time.monotonic())
    events = []
    for node in cluster.nodes:
        logs, mark = marks[node.name]
        pattern = (r"acknowledged nothing|steps down|stepped down|elected primary|"
                   r"is named the synchronous")
        if len(node.logs) == logs:
            events += [f"{node.name}: {line}" for line in _since(node, mark, pattern)]
        else:  # started again meanwhile: its earlier log, then the new one
            earlier = node.logs[logs - 1].read_text(errors="replace")[mark:]
            events += [f"{node.name}: {line[:220]}" for line in earlier.splitlines()
                       if re.search(pattern, line)]
            events += [f"{node.name}: {line}" for line in _since(node, 0, pattern)]
    # (each line begins with its time: in the order things happened)
    return Fault(what, seconds, unavailable, None if first is None else first - start,
                 sorted(events, key=lambda line: line.split(": ", 1)[1]))


async def measure(lease: int, pause: float, cut: float,
                  keep_logs: Path | None = None) -> tuple[list[Fault], Takeovers]:
    def make(root: Path, lease: int) -> Cluster:
        return ProxiedCluster(root, lease)

    faults: list[Fault] = []
    checked = Takeovers()
    async with running_cluster(lease, keep_logs, make) as running:
        cluster = running
        assert isinstance(cluster, ProxiedCluster)
        primary, _ = await cluster.primary()
        await cluster.copies(primary)
        # The primary's own address first: the client reaches it directly (a standby
        # would send it to the primary's advertised address, through the proxy).
        submitter = Submitter(",".join(
            [primary.address] + [node.address for node in cluster.nodes if node is not primary]))
        try:
            await asyncio.wait_for(submitter.start(), 30)
            named = _NAMED.findall(primary.log())[-1]
            sync = next(node for node in cluster.nodes if node.name == named)
            assert sync.proc is not None
            pid = sync.proc.pid
            say(f"SIGSTOP of the synchronous standby {named} for {pause:g} s ...")
            faults.append(await _fault(
                cluster, submitter, f"SIGSTOP of the synchronous standby for {pause:g} s",
                pause, lambda: os.kill(pid, signal.SIGSTOP),
                lambda: os.kill(pid, signal.SIGCONT)))
            primary, _ = await cluster.primary()
            proxy = cluster.proxies[primary.name]
            say(f"cut of the primary {primary.name} from its standbys for {cut:g} s ...")
            faults.append(await _fault(
                cluster, submitter, f"the primary cut off from its standbys for {cut:g} s",
                cut, lambda: setattr(proxy, "cut_off", True),
                lambda: setattr(proxy, "cut_off", False)))
            await submitter.stop()
            checked.acknowledged = len(submitter.acknowledged)
            checked.errors = dict(submitter.errors)
            await asyncio.wait_for(submitter.verify(VERIFY_SAMPLE, checked), 60)
        finally:
            await submitter.stop()
            await submitter.close()
    return faults, checked


def report(lease: int, faults: list[Fault], checked: Takeovers) -> str:
    lines = []
    target = 2 * lease + 1
    for fault in faults:
        first = "-" if fault.first_ack is None else f"{fault.first_ack:.2f} s"
        lines.append(f"{fault.what} (cluster lease {lease} s): longest time without an "
                     f"acknowledged write {fault.unavailable:.2f} s (target <= 2 x {lease} s + "
                     f"1 s = {target} s: {'met' if fault.unavailable <= target else 'missed'});"
                     f" the fault to the first acknowledged write sent after it {first}")
        lines += [f"    {event}" for event in fault.events]
    lines.append(f"acknowledged submits {checked.acknowledged}; errors {checked.errors}; "
                 f"{checked.verified} read back, missing: {checked.missing or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_faults",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease-seconds", type=int, default=DEFAULT_LEASE)
    parser.add_argument("--pause", type=float, default=8.0,
                        help="seconds the synchronous standby is stopped (default 8)")
    parser.add_argument("--cut", type=float, default=12.0,
                        help="seconds the primary is cut off from its standbys (default 12)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the logs here")
    args = parser.parse_args(argv)
    command = "python -m bench.cluster_faults " + " ".join(sys.argv[1:] if argv is None
                                                            else argv)
    faults, checked = asyncio.run(measure(args.lease_seconds, args.pause, args.cut,
                                          args.logs))
    print(f"$ {command.strip()}")
    print(report(args.lease_seconds, faults, checked))
    if checked.missing:
        sys.exit(1)


if __name__ == "__main__":
    main()
