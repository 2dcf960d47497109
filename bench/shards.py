"""Shards side by side: claims and tasks through 1, 2 and 4 primaries of one sharded
cluster, each with the same client processes, beside a single rsd alone.

    python -m bench.shards [--shards 1,2,4] [--fsync no,always] [--seconds 3]
    python -m bench --only shards

Each shard is one primary (``--shard sK``; no standby under ``--fsync no``: what is
measured is what sharding costs and gives, not replication; under ``--fsync always``
each primary has its synchronous standby, as a cluster must to acknowledge anything),
all on one etcd member on loopback; the
slots are spread evenly (``rsctl slots balance``) before anything is measured. Every
shard gets its own client processes, exactly as the single rsd gets them: for claims,
one process of ``CLIENTS`` coroutines acquiring and releasing in a run placed on that
shard; for tasks, one planner and one worker process (``bench.tasks``) on a run placed
on that shard. All start at the same instant and measure for ``--seconds``.

Printed per shard count and fsync policy: the aggregate throughput, each shard's CPU per
operation (from /proc of its process over the same window), and both against the single
rsd alone: the sharding tax (a shard's CPU per operation over the single node's; target
at most 1.1) and the gain (aggregate over the single node's; on a 2-core machine, 2
shards target at least 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import claims, tasks
from bench.cluster import Etcd, Node
from bench.harness import cpu_seconds, rsd_process
from rsclient import wire
from rsproto.slots import SlotMap, slot_of

CLIENTS = 64  # coroutines of a claims client, tasks in flight (as bench.steps)
PRIMARY_TIMEOUT = 30.0
START_MARGIN = 1.5  # seconds between launching the client processes and their common start


@dataclass
class Measured:
    """One measurement: operations done and CPU seconds of each server over the window."""

    kind: str  # "claims" or "tasks"
    shards: int  # 0: a single rsd alone
    fsync: str
    seconds: float
    done: list[int]  # per shard (per client process set)
    cpu: list[float]  # per shard

    @property
    def rate(self) -> float:
        return sum(self.done) / self.seconds

    def us_per_op(self) -> list[float]:
        return [cpu / done * 1e6 if done else float("nan")
                for cpu, done in zip(self.cpu, self.done, strict=True)]


async def slot_map(address: str) -> SlotMap:
    """The map as SLOT_MAP answers it (a bare connection: HELLO, SLOT_MAP)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(wire.request_frame(1, wire.Op.HELLO, {"version": 1, "holder": "bench"})
                     + wire.request_frame(2, wire.Op.SLOT_MAP, {}))
        decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        while True:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError(f"{address} closed the connection")
            for message in decoder.feed(data):
                if message[0] == wire.ERROR:
                    raise RuntimeError(f"{address} answered {message[2]}: {message[3]}")
                if message[0] == wire.REPLY and message[1] == 2:
                    return SlotMap.from_wire(message[2])
    finally:
        writer.close()


def placement_in(owned: SlotMap, shard: str) -> str:
    """A placement string whose slot ``shard`` owns."""
    for n in range(1_000_000):
        if owned.owner(slot_of(f"bench-{n}", owned.slots)) == shard:
            return f"bench-{n}"
    raise RuntimeError(f"no placement found for shard {shard}")


class Shards:
    """``count`` shards on one etcd member under ``root``: each one primary (``nodes``)
    and, under ``--fsync always``, its synchronous standby (``standbys``: a primary
    alone acknowledges nothing when every change must be on a standby too)."""

    def __init__(self, root: Path, count: int, fsync: str) -> None:
        self.etcd = Etcd(root / "etcd", size=1)
        self.nodes = [Node(f"s{k}", root / f"s{k}") for k in range(count)]
        self.standbys = ([Node(f"s{k}b", root / f"s{k}b") for k in range(count)]
                         if fsync == "always" else [])
        self.fsync = fsync

    def args(self, node: Node) -> list[str]:
        return ["--etcd", self.etcd.endpoints, "--cluster", "bench-shards", "--node",
                node.name, "--shard", node.name.removesuffix("b"), "--fsync", self.fsync]

    async def start(self) -> None:
        await asyncio.to_thread(self.etcd.start)
        # the first shard makes the map (every slot its own), then the others join
        await self.nodes[0].start(*self.args(self.nodes[0]))
        await self._primary(self.nodes[0])
        await asyncio.gather(*(node.start(*self.args(node)) for node in self.nodes[1:]))
        for node in self.nodes[1:]:
            await self._primary(node)
        await asyncio.gather(*(node.start(*self.args(node)) for node in self.standbys))
        for primary in self.nodes if self.standbys else ():
            await self._sync_named(primary)
        if len(self.nodes) > 1:
            await self._balance()

    async def _sync_named(self, node: Node) -> None:
        deadline = time.monotonic() + PRIMARY_TIMEOUT
        while "is named the synchronous standby" not in node.log():
            if time.monotonic() > deadline or not node.alive:
                raise RuntimeError(f"{node.name} named no standby:\n{node.log()[-2000:]}")
            await asyncio.sleep(0.05)

    async def _primary(self, node: Node) -> None:
        deadline = time.monotonic() + PRIMARY_TIMEOUT
        while node.primary_epoch() == 0:
            if time.monotonic() > deadline or not node.alive:
                raise RuntimeError(f"{node.name} did not become primary:\n{node.log()[-2000:]}")
            await asyncio.sleep(0.05)

    async def _balance(self) -> None:
        """``rsctl slots balance``, until every shard owns slots."""
        address = self.nodes[0].address
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "rsctl", "--address", address, "slots",
                             "balance", "--rate", "1000"],
            capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"rsctl slots balance failed: {done.stdout}{done.stderr}")
        deadline = time.monotonic() + PRIMARY_TIMEOUT
        while True:
            owned = await slot_map(address)
            if all(entry.ranges for entry in owned.shards()) and len(owned.shards()) == len(
                    self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the slots were not spread: {owned}")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes + self.standbys),
                             return_exceptions=True)
        self.etcd.stop()


@contextlib.asynccontextmanager
async def running_shards(count: int, fsync: str) -> AsyncIterator[Shards]:
    with tempfile.TemporaryDirectory(prefix="rsd-bench-shards-") as where:
        shards = Shards(Path(where), count, fsync)
        try:
            await shards.start()
            yield shards
        finally:
            await shards.stop()
            for node in shards.nodes + shards.standbys:
                if node.alive and node.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        node.proc.kill()


async def _client(kind: str, address: str, placement: str | None, start_at: float,
                  seconds: float) -> asyncio.subprocess.Process:
    argv = [sys.executable, "-m", "bench.shards", "--role", kind, "--address", address,
            "--start-at", repr(start_at), "--seconds", repr(seconds)]
    if placement is not None:
        argv += ["--placement", placement]
    return await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)


async def measure(kind: str, targets: Sequence[tuple[str, str | None, int]], seconds: float,
                  shards: int, fsync: str) -> Measured:
    """Start one client set per target (address, placement, server pid) at one instant;
    the operations each did and each server's CPU over the window."""
    start_at = time.time() + START_MARGIN
    procs = [await _client(kind, address, placement, start_at, seconds)
             for address, placement, _ in targets]
    await asyncio.sleep(max(0.0, start_at - time.time()))
    before = [cpu_seconds(pid) for _, _, pid in targets]
    await asyncio.sleep(seconds)
    after = [cpu_seconds(pid) for _, _, pid in targets]
    done = []
    for proc in procs:
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a {kind} client failed ({proc.returncode}): {out.decode()}")
        done.append(int(json.loads(out.decode().strip().splitlines()[-1])["done"]))
    return Measured(kind, shards, fsync, seconds, done,
                    [b - a for a, b in zip(before, after, strict=True)])


async def measure_single(seconds: float, fsync: str) -> list[Measured]:
    async with rsd_process("--fsync", fsync) as server:
        target = [(server.address, None, server.pid)]
        return [await measure(kind, target, seconds, 0, fsync) for kind in ("claims", "tasks")]


async def measure_sharded(count: int, seconds: float, fsync: str) -> list[Measured]:
    async with running_shards(count, fsync) as shards:
        owned = await slot_map(shards.nodes[0].address)
        targets = []
        for node in shards.nodes:
            assert node.proc is not None
            targets.append((node.address, placement_in(owned, node.name), node.proc.pid))
        return [await measure(kind, targets, seconds, count, fsync)
                for kind in ("claims", "tasks")]


def report(single: Measured, sharded: list[Measured]) -> list[str]:
    base = single.us_per_op()[0]
    lines = [f"{single.kind}, fsync {single.fsync}: single rsd {single.rate:,.0f}/s, "
             f"{base:.1f} us CPU per op"]
    for run in sharded:
        costs = run.us_per_op()
        lines.append(
            f"  {run.shards} shard(s): {run.rate:,.0f}/s ({run.rate / single.rate:.2f}x the "
            f"single rsd); CPU per op per shard "
            + ", ".join(f"{c:.1f} us ({c / base:.2f}x)" for c in costs))
    return lines


async def main_run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for fsync in args.fsync.split(","):
        single = await measure_single(args.seconds, fsync)
        sharded: list[list[Measured]] = []
        for count in (int(n) for n in args.shards.split(",")):
            sharded.append(await measure_sharded(count, args.seconds, fsync))
        for i, kind in enumerate(("claims", "tasks")):
            lines = report(single[i], [runs[i] for runs in sharded])
            print("\n".join(lines), flush=True)
            results[f"{kind}.{fsync}"] = {
                "single": {"rate": single[i].rate, "us_per_op": single[i].us_per_op()[0]},
                "shards": [{"shards": runs[i].shards, "rate": runs[i].rate,
                            "us_per_op": runs[i].us_per_op()} for runs in sharded],
            }
    return results


async def client_role(args: argparse.Namespace) -> None:
    """One client set: wait for ``--start-at``, run for ``--seconds``, print {"done": N}."""
    if args.role == "claims":
        rate = await claims.throughput(args.address, CLIENTS, args.seconds,
                                       placement=args.placement, start_at=args.start_at)
    else:
        rate, _ = await tasks.measure(args.address, args.seconds, CLIENTS, CLIENTS,
                                      placement=args.placement, start_at=args.start_at)
    print(json.dumps({"done": round(rate * args.seconds)}), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="1,2,4", help="shard counts (default 1,2,4)")
    parser.add_argument("--fsync", default="no,always", help="policies (default no,always)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--role", choices=["claims", "tasks"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--placement", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.role is not None:
        asyncio.run(client_role(args))
        return
    results = asyncio.run(main_run(args))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
