"""etcd far away: does a cluster start, keep its primary and acknowledge writes, and can a
node start again, with etcd DELAY seconds away each way?

    python -m bench.far_etcd [--delay 0.6 1.0] [--lease 5] [--seconds 20] [--late]
                             [--tree PATH]

Each run starts 3 etcd members (``/usr/bin/etcd``, as tests/support/etcd.py starts them)
behind one proxy each that delays every byte DELAY seconds each way (tests/support/proxy.py),
and 3 nodes given the proxies (``--fsync always``, ``--cluster-lease-seconds`` LEASE).
With ``--late`` the proxies delay nothing until the first write is acknowledged (a primary
led while etcd was near; then etcd moves away). A client given every node submits a
task every 0.1 s for ``--seconds``. Reported per delay: which nodes started (printed their
ready line), when the first write was acknowledged, the writes acknowledged and failed,
the elections won and leaderships lost (from the logs), each node's exit code, and then
whether a standby that is killed and started again runs 3 s later.

``--tree`` runs the rsd of another checkout (``--tree /work/main`` for the figures before
a change); etcd, the proxies, the client and this script are this checkout's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the harness
from support.etcd import EtcdCluster
from support.proxy import Proxy

from rsclient import AsyncRunstate, RunstateError

HERE = Path(__file__).resolve().parent.parent
READY_SECONDS = 15.0  # for a node's ready line (or its exit)
RESTARTED_SECONDS = 3.0  # a restarted node must still run this long after its ready line


class Node:
    """One rsd node of ``tree``, its log in ``root``."""

    def __init__(self, tree: Path, root: Path, name: str, flags: list[str]) -> None:
        self.tree, self.root, self.name, self.flags = tree, root, name, flags
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.port = 0
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}-{self.starts}.log"

    def start(self) -> str:
        """Start it and wait for its ready line; the line, or how it ended."""
        self.starts += 1
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(self.tree), PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rsd", "--listen", f"127.0.0.1:{self.port}",
                 "--data-dir", str(self.root / f"{self.name}.data"), "--node", self.name,
                 *self.flags],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, cwd=self.tree,
                env=env)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_SECONDS)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        found = re.match(r"rsd listening on (\S+):(\d+)$", line)
        if found is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)  # at the end of its output: exiting
            return f"exit {self.proc.poll()}" if self.proc.poll() is not None else "no ready line"
        self.port = int(found.group(2))
        self.address = f"{found.group(1)}:{self.port}"
        return "started"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        return "\n".join((self.root / f"{self.name}-{n}.log").read_text(errors="replace")
                         for n in range(1, self.starts + 1))


async def one_run(tree: Path, delay: float, lease: int, seconds: float, late: bool) -> None:
    root = Path(tempfile.mkdtemp(prefix="far-etcd-"))
    etcd = EtcdCluster(root / "etcd", 3).start()
    proxies = [await Proxy("127.0.0.1", member.client_port, 0.0 if late else delay).start()
               for member in etcd.members]
    flags = ["--etcd", ",".join(proxy.address for proxy in proxies), "--cluster", "far",
             "--cluster-lease-seconds", str(lease), "--fsync", "always"]
    nodes = [Node(tree, root, f"n{i}", flags) for i in range(3)]
    try:
        began = time.monotonic()
        starts = await asyncio.gather(*(asyncio.to_thread(node.start) for node in nodes))
        acknowledged = failed = 0
        first = "never"
        up = [node.address for node in nodes if node.address]
        if up:
            rs = AsyncRunstate(holder="far", address=",".join(up), connect_timeout=30)
            try:
                await asyncio.wait_for(rs.mailboxes.ensure("work", mode="WORK"), 60)
                run = await rs.scopes.create()
                first = f"{time.monotonic() - began:.1f} s after the start"
                for proxy in proxies:
                    proxy.delay = delay
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    try:
                        await asyncio.wait_for(run.mailbox("work").submit({}), 15)
                        acknowledged += 1
                    except (RunstateError, TimeoutError):
                        failed += 1
                    await asyncio.sleep(0.1)
            except (RunstateError, TimeoutError) as exc:
                first = f"never ({type(exc).__name__})"
            finally:
                await rs.close()
        logs = "\n".join(node.log() for node in nodes)
        exits = [None if node.alive() else node.proc.poll() if node.proc else None
                 for node in nodes]
        standby = next((node for node in nodes
                        if node.alive() and "is the primary" not in node.log()), nodes[0])
        standby.kill()
        restart = await asyncio.to_thread(standby.start)
        if restart == "started":
            await asyncio.sleep(RESTARTED_SECONDS)
            restart = "runs 3 s later" if standby.alive() else (
                f"exit {standby.proc.poll() if standby.proc else None} within 3 s")
        where = " (etcd near until the first write)" if late else ""
        print(f"delay {delay:g} s each way{where}, lease {lease} s, tree {tree}: "
              f"starts {starts}; first write acknowledged {first}; over {seconds:g} s "
              f"{acknowledged} writes acknowledged, {failed} failed; elected "
              f"{logs.count('elected primary')}, lost leadership "
              f"{logs.count('lost leadership')}; exits {exits}; a standby killed and "
              f"started again: {restart}", flush=True)
        for line in sorted(set(re.findall(r"CRITICAL rsd: ([^\n]*)", logs)))[:2]:
            print(f"    {line}", flush=True)
    finally:
        for node in nodes:
            node.kill()
        for proxy in proxies:
            with contextlib.suppress(Exception):
                await proxy.close()
        etcd.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--delay", type=float, nargs="+", default=[0.6, 1.0],
                        help="seconds each way, one run each (default 0.6 1.0)")
    parser.add_argument("--lease", type=int, default=5, help="--cluster-lease-seconds")
    parser.add_argument("--seconds", type=float, default=20.0, help="writes for this long")
    parser.add_argument("--late", action="store_true",
                        help="etcd near until the first write is acknowledged")
    parser.add_argument("--tree", type=Path, default=HERE, help="the checkout to run rsd of")
    args = parser.parse_args()
    for delay in args.delay:
        asyncio.run(one_run(args.tree.resolve(), delay, args.lease, args.seconds, args.late))


if __name__ == "__main__":
    main()
