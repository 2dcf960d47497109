"""``make run-cluster SHARDS=N`` (``python -m rsd.localcluster --shards N``): a sharded
cluster on the cores of one machine, for a user who has not read the cluster chapter.

It starts one local etcd member (``etcd`` on PATH or /usr/bin/etcd; its data under
``--dir``), then N shards of one node each (``--shard sN --node sN``, each on its own port
and data directory under ``--dir``), waits until every shard has its primary, spreads
the slots evenly over them (``rsctl slots balance``), and prints where each listens and
how to stop. A node alone in its shard acknowledges without a standby: ``--fsync
everysec`` unless other options follow ``--``. Ctrl-C (SIGINT) or SIGTERM stops
everything it started: the nodes first (SIGTERM: each stops cleanly), then etcd; nothing
is left running (each child is also told to die with it, should this process be
killed). A child that ends on its own ends the whole, with its log's last lines.

Nothing here imports the rest of rsd or rsctl: they are run as the user would run them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["main"]

START_SECONDS = 60.0  # for etcd to be healthy, a node to listen, every shard to lead
STOP_SECONDS = 10.0  # for a child to end after SIGTERM, before SIGKILL
POLL_SECONDS = 0.2
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
# Each shard is one node, with no standby: under --fsync always a cluster's primary
# acknowledges only what a standby holds too, so nothing would be. Options given after
# ``--`` come later and win.
NODE_DEFAULTS = ("--fsync", "everysec")


class StartFailed(Exception):
    """Something this cluster needs did not start (the message says what, and its log)."""


@dataclass
class Child:
    """One process started here, its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    address: str = ""

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


@dataclass
class LocalCluster:
    """What ``main`` started, stopped in the reverse order."""

    root: Path
    cluster: str
    children: list[Child] = field(default_factory=list)
    etcd_address: str = ""

    def spawn(self, name: str, argv: Sequence[str]) -> Child:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:  # the child keeps its own copy
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=out,
                                    preexec_fn=_die_with_parent, start_new_session=True)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def stop(self) -> None:
        """SIGTERM to every node, then to etcd, each waited for (SIGKILL past
        ``STOP_SECONDS``)."""
        for group in (self.children[1:], self.children[:1]):  # the nodes, then etcd
            for child in group:
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            for child in group:
                try:
                    child.proc.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
                if child.proc.stdout is not None:
                    child.proc.stdout.close()

    def ended(self) -> Child | None:
        """A child that has ended on its own, if any."""
        return next((c for c in self.children if c.proc.poll() is not None), None)


def _die_with_parent() -> None:
    """In the child: SIGKILL when this process dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (bound together, then let go)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise StartFailed("etcd is not installed: `make run-cluster` installs Debian's "
                          "etcd-server as root, or run `apt-get install etcd-server`")
    return found


def start_etcd(local: LocalCluster) -> None:
    """One etcd member on two free loopback ports, waited for until healthy."""
    client, peer = _free_ports(2)
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    child = local.spawn("etcd", [
        _etcd_binary(), "--name", "local", "--data-dir", str(local.root / "etcd"),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"local={peer_url}", "--initial-cluster-state", "new",
        "--grpc-keepalive-min-time", "1s",  # rsd pings every second (cluster/client.py)
        "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
    ])
    deadline = time.monotonic() + START_SECONDS
    while True:
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(
                client_url + "/health", timeout=1) as answer:
            if json.loads(answer.read()).get("health") == "true":
                break
        if child.proc.poll() is not None or time.monotonic() > deadline:
            raise StartFailed(f"etcd did not start; its log:\n{child.tail()}")
        time.sleep(POLL_SECONDS)
    child.address = local.etcd_address = f"127.0.0.1:{client}"


def start_node(local: LocalCluster, shard: str, port: int, extra: Sequence[str]) -> Child:
    """Shard ``shard``'s one node, waited for until it listens (its ready line)."""
    data = local.root / shard
    data.mkdir(parents=True, exist_ok=True)
    child = local.spawn(shard, [
        sys.executable, "-m", "rsd", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
        "--etcd", local.etcd_address, "--cluster", local.cluster, "--node", shard,
        "--shard", shard, *NODE_DEFAULTS, *extra,
    ])
    line = _first_line(child, START_SECONDS)
    prefix = "rsd listening on "
    if not line.startswith(prefix):
        raise StartFailed(f"shard {shard} did not start (exit {child.proc.poll()}); its log:"
                          f"\n{child.tail()}")
    child.address = line[len(prefix):]
    return child


def _first_line(child: Child, timeout: float) -> str:
    """The first line the child writes on stdout, or what came before EOF or the timeout."""
    assert child.proc.stdout is not None
    fd, got = child.proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while b"\n" not in got and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got.split(b"\n", 1)[0].decode(errors="replace").strip()


def rsctl(address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``rsctl --address ADDRESS ARGV...`` as the user would run it."""
    return subprocess.run([sys.executable, "-m", "rsctl", "--address", address, *argv],
                          capture_output=True, text=True, check=False, timeout=START_SECONDS)


def wait_for_primaries(local: LocalCluster, shards: int, stopping: list[int]) -> None:
    """Until the map lists ``shards`` shards, each with a primary (``rsctl slots``), or
    a stop is asked for (``stopping`` not empty)."""
    address = local.children[1].address
    deadline = time.monotonic() + START_SECONDS
    said = ""
    while time.monotonic() < deadline and not stopping:
        if (ended := local.ended()) is not None:
            raise StartFailed(f"{ended.name} ended (exit {ended.proc.returncode}); its log:"
                              f"\n{ended.tail()}")
        shown = rsctl(address, "slots", "--json")
        said = shown.stderr.strip() or shown.stdout.strip()
        if shown.returncode == 0:
            listed = json.loads(shown.stdout)["shards"]
            if len(listed) == shards and all(s["primary"] for s in listed):
                return
        time.sleep(POLL_SECONDS)
    if stopping:
        return
    raise StartFailed(f"the shards did not all get a primary within {START_SECONDS:g} s "
                      f"(rsctl slots: {said})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rsd.localcluster",
        description="A sharded rsd cluster on this machine: one local etcd member and N "
        "shards of one node each, the slots spread evenly. Ctrl-C stops it all.")
    parser.add_argument("--shards", type=int, default=2, help="how many shards (default 2)")
    parser.add_argument("--dir", default="run-cluster",
                        help="where the data and logs go (default ./run-cluster)")
    parser.add_argument("--port", type=int, default=7420,
                        help="shard sN listens on PORT+N-1 (default 7420; 0: free ports)")
    parser.add_argument("--cluster", default="local", help="the cluster's name (default local)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="slot ranges moved a second while balancing (default 100)")
    parser.add_argument("rsd_args", nargs="*", metavar="-- RSD_ARG",
                        help="more options for every node (after --), e.g. -- --fsync no")
    return parser


def _announce(local: LocalCluster) -> None:
    first = local.children[1].address
    print(f"etcd at {local.etcd_address} (pid {local.children[0].proc.pid}), data and logs "
          f"in {local.root}")
    for child in local.children[1:]:
        print(f"shard {child.name} listening on {child.address} (pid {child.proc.pid}), data "
              f"in {local.root / child.name}, log {child.log}")
    print(f"clients: RUNSTATE_ADDRESS={first}; the map: rsctl --address {first} slots")
    print("Ctrl-C stops every process started here", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start, serve until Ctrl-C/SIGTERM or until a child ends, stop all; the exit status
    (0 after a stop asked for, 1 when something did not start or ended on its own)."""
    args = _parser().parse_args(argv)
    if not 1 <= args.shards <= 64:
        print("localcluster: --shards must be 1 to 64", file=sys.stderr)
        return 2
    local = LocalCluster(Path(args.dir).resolve(), args.cluster)
    local.root.mkdir(parents=True, exist_ok=True)
    stopping: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, frame: stopping.append(number))
    status = 0
    try:
        start_etcd(local)
        for n in range(1, args.shards + 1):
            if stopping:
                return 0
            port = 0 if args.port == 0 else args.port + n - 1
            start_node(local, f"s{n}", port, args.rsd_args)
        wait_for_primaries(local, args.shards, stopping)
        if stopping:
            return 0
        balanced = rsctl(local.children[1].address, "slots", "balance",
                         "--rate", str(args.rate))
        print(balanced.stdout, end="")
        if balanced.returncode != 0:
            raise StartFailed(f"rsctl slots balance failed: {balanced.stderr.strip()}")
        _announce(local)
        while not stopping:
            if (ended := local.ended()) is not None:
                print(f"{ended.name} ended (exit {ended.proc.returncode}); its log:\n"
                      f"{ended.tail()}", file=sys.stderr)
                status = 1
                break
            time.sleep(POLL_SECONDS)
    except StartFailed as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        status = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C does not cut the stop short
        print("stopping every process started here", flush=True)
        local.stop()
        print("stopped", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
