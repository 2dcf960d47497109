"""A three-node cluster beside a single rsd: throughput, takeover time, replication lag.

Starts 3 etcd members (Debian's etcd 3.4, ``/usr/bin/etcd``) and 3 rsd nodes
(``--etcd ... --cluster bench --node nI --fsync always``) on loopback ports of their own,
and a single rsd (``--fsync always``), and measures:

1. throughput through the cluster's primary (the clients are given every node's address)
   beside the single rsd, back to back with the same client code: claims as
   ``bench.claims.throughput`` (acquire+release pairs, 64 coroutines on one client) and
   tasks as ``bench.tasks.measure`` (a planner keeping 64 keyed tasks submitted and
   awaiting each result, a worker process running ``consume()``); the ratio
   cluster/single (target >= 0.5);
2. replication lag, sampled every 0.1 s during those cluster windows: as rsd reports it,
   SERVER_STATS' ``cluster.members[].lag_records`` on the primary (records it has that a
   standby has not acknowledged, i.e. fsynced), and, as a check from outside, in journal
   bytes: the primary's ``journal_bytes`` against the record bytes in each standby's
   journal files (what it has written; the zeros the journal writes ahead are left out),
   both counted from a quiet moment before the load when every standby held everything
   (the residual once the load is over and settled says how exact that is). A bytes
   sample is the primary's figure when it answered against the standby's files read
   right after: 0 when the standby held at least that much, so it understates the lag
   by that round trip. A standby that takes a new copy (its stream was cut) starts its
   journal over and is left out of the bytes from then on (counted). Beside them: the
   primary's ``held_batches`` (replies waiting for its fsync and the synchronous
   standby's), and after the load the time each standby takes to hold everything;
3. takeover: a client of every node's address submits keyed tasks in a loop; the
   primary is killed (SIGKILL) ``--kills`` times; each time, the time from the kill to
   the first acknowledged submit sent after it (so answered by the new primary; the one
   in flight at the kill is sent again by the SDK and answered first); then the killed
   node is started again on its port and the run waits until the new primary logs
   "standby NODE has its copy" for both standbys. Target: 2 x cluster lease + 1 s.
   Finally a sample of the acknowledged submits is checked on the last primary.

At the end every process is stopped (also on failure or Ctrl-C) and the node logs are
searched for "Traceback", "ERROR" and "CRITICAL", and for exits nobody asked for.

    python -m bench.cluster [--quick] [--kills N] [--seconds S] [--lease-seconds S]
                            [--logs DIR]
    python -m bench --only cluster [--kills N]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import claims, tasks
from bench.harness import rsd_process
from rsclient import AsyncRunstate, RunstateError
from rsd.disk.datadir import segments

__all__ = ["ClusterFigures", "etcd_binary", "measure"]

CLUSTER = "bench"
NODES = 3
CLIENTS = 64  # coroutines of the claims client, tasks in flight (as bench.steps)
DEFAULT_KILLS = 20
QUICK_KILLS = 3
DEFAULT_LEASE = 5  # --cluster-lease-seconds, rsd's default
ETCD_START_TIMEOUT = 20.0  # seconds for every etcd member to be healthy
NODE_READY_TIMEOUT = 30.0  # seconds for a node to print its listening line
PRIMARY_TIMEOUT = 30.0  # seconds for a primary to be elected at start
COPY_TIMEOUT = 30.0  # seconds for a restarted standby to have its copy
TAKEOVER_GIVE_UP = 60.0  # seconds after a kill with no acknowledged change: stop killing
LAG_SAMPLE_SECONDS = 0.1
CATCH_UP_TIMEOUT = 10.0
VERIFY_SAMPLE = 500  # acknowledged submits checked on the last primary
LOG_LINES_SHOWN = 8

_PRIMARY = re.compile(r": (\S+) is the primary \(epoch (\d+)\)")
_READY = re.compile(r"^rsd listening on (\S+):(\d+)$")

# Every process this module started and has not yet seen exit: killed at interpreter exit
# if something skipped the orderly stop (the run's own `finally` stops them first).
_STARTED: dict[int, str] = {}


def _kill_leftovers() -> None:
    for pid in list(_STARTED):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        _STARTED.pop(pid, None)


atexit.register(_kill_leftovers)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def etcd_binary() -> str | None:
    """The etcd server binary (Debian's etcd-server), or None."""
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd")
                                     else None)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probes.append(probe)
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


async def _seen(node: Node, text: str, timeout: float) -> float:
    """When (monotonic) ``text`` is first seen in the node's current log, polled every
    20 ms (log timestamps are wall-clock time, which can be stepped under a run)."""
    deadline = time.monotonic() + timeout
    while text not in node.log():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {node.name}'s log within {timeout:g} s")
        await asyncio.sleep(0.02)
    return time.monotonic()


def _signature(line: str) -> str:
    """What a logged error is about: its exception (the last one named), else its text."""
    found = re.findall(r"\b(\w+(?:Error|Exception)): ([^|]{0,100})", line)
    frames = re.findall(r'File "[^"]*/(rsd/[\w/]+\.py)", line (\d+), in (\w+)', line)
    if found:
        at = f" at {frames[-1][0]}:{frames[-1][1]} {frames[-1][2]}" if frames else ""
        return f"{found[-1][0]}: {found[-1][1].strip()}{at}"
    return line.split(" ", 2)[-1][:120]


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


# ---- etcd ------------------------------------------------------------------------------


class Etcd:
    """``size`` etcd members on loopback, as tests/support/etcd.py starts them (that module
    imports pytest, which the bench extra does not install): ports picked by binding port
    0, the whole cluster started again on new ports if one was taken meanwhile;
    ``--grpc-keepalive-min-time=1s`` (rsd pings etcd every second); a cluster token of its
    own."""

    def __init__(self, root: Path, size: int = 3) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install etcd-server (as root)")
        self.binary = binary
        self.root = root
        self.size = size
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client_ports: list[int] = []
        self.logs: list[Path] = []

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.client_ports)

    def start(self) -> None:
        for attempt in range(4):
            ports = _free_ports(2 * self.size)
            self.client_ports = ports[0::2]
            peers = ports[1::2]
            token = f"rsd-bench-{uuid.uuid4().hex[:12]}"
            cluster = ",".join(f"e{n}=http://127.0.0.1:{peers[n]}" for n in range(self.size))
            here = self.root / f"etcd-try{attempt}"
            here.mkdir(parents=True)
            self.logs = [here / f"e{n}.log" for n in range(self.size)]
            for n in range(self.size):
                client_url = f"http://127.0.0.1:{self.client_ports[n]}"
                argv = [
                    self.binary, "--name", f"e{n}", "--data-dir", str(here / f"e{n}.data"),
                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                    "--listen-peer-urls", f"http://127.0.0.1:{peers[n]}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[n]}",
                    "--initial-cluster", cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token, "--grpc-keepalive-min-time", "1s",
                    "--logger", "zap", "--log-outputs", "stderr", "--log-level", "info",
                ]
                with open(self.logs[n], "wb") as log_file:  # the child holds its own copy
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                            stderr=log_file)
                self.procs.append(proc)
                _STARTED[proc.pid] = f"etcd e{n}"
            if self._wait_healthy():
                return
            taken = any("address already in use" in path.read_text(errors="replace")
                        for path in self.logs)
            self.stop()
            if not taken:
                break
        raise RuntimeError("etcd did not start; logs:\n" + "\n".join(
            f"--- {path}\n{path.read_text(errors='replace')[-2000:]}" for path in self.logs))

    def _healthy(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                        timeout=1.0) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + ETCD_START_TIMEOUT
        waiting = list(self.client_ports)
        while waiting and time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self.procs):
                return False
            waiting = [port for port in waiting if not self._healthy(port)]
            if waiting:
                time.sleep(0.05)
        return not waiting

    def raft_term(self) -> int | None:
        """The highest raft term a member reports (its status, over the HTTP gateway): it
        grows with every etcd leader election. None if no member answers."""
        terms = []
        for port in self.client_ports:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v3/maintenance/status", data=b"{}", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=1.0) as reply:
                    terms.append(int(json.loads(reply.read())["raftTerm"]))
            except (OSError, ValueError, KeyError, urllib.error.URLError):
                continue
        return max(terms) if terms else None

    def stop(self) -> None:
        """SIGKILL every member (their data is thrown away) and reap them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            _STARTED.pop(proc.pid, None)
        self.procs = []


# ---- rsd nodes ---------------------------------------------------------------------------


class Node:
    """One rsd node of the cluster: its data directory, its port (kept across restarts:
    the clients' address list stays right), a log file per start."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self.data = root / "data"
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.logs: list[Path] = []
        self.stopped_by_us = False  # its last exit was this run's doing (a kill, the end)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, *args: str) -> None:
        self.stopped_by_us = False
        self.root.mkdir(parents=True, exist_ok=True)
        log_path = self.root / f"{self.name}-{len(self.logs)}.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as log_file:  # the child holds its own copy
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rsd", "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", str(self.data), *args,
                stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log_file,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        _STARTED[self.proc.pid] = f"rsd {self.name}"
        assert self.proc.stdout is not None
        try:
            line = (await asyncio.wait_for(self.proc.stdout.readline(),
                                           NODE_READY_TIMEOUT)).decode()
        except TimeoutError:
            line = ""
        match = _READY.match(line.strip())
        if match is None:
            await self.kill()
            raise RuntimeError(f"node {self.name} did not start (said {line!r}); log:\n"
                               f"{self.log()[-3000:]}")
        self.port = int(match.group(2))

    def log(self) -> str:
        """The log of the current (last) start."""
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def primary_epoch(self) -> int:
        """The epoch this start of the node leads (its log says so), 0 if none."""
        found = [int(epoch) for name, epoch in _PRIMARY.findall(self.log())
                 if name == self.name]
        return found[-1] if found else 0

    async def _reaped(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            return None
        _STARTED.pop(self.proc.pid, None)
        return code

    async def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.stopped_by_us = True
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.proc is not None:
            await self._reaped(10)

    async def stop(self) -> int | None:
        """SIGTERM, SIGKILL after 5 s; the exit code."""
        if self.alive:
            assert self.proc is not None
            self.stopped_by_us = True
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            if await self._reaped(5) is None:
                await self.kill()
        return None if self.proc is None else self.proc.returncode


class Cluster:
    """3 etcd members and 3 rsd nodes under ``root``."""

    def __init__(self, root: Path, lease: int) -> None:
        self.root = root
        self.lease = lease
        self.etcd = Etcd(root)
        self.nodes = [Node(f"n{i}", root / f"n{i}") for i in range(NODES)]
        self.unexpected: list[str] = []  # exits nobody asked for

    @property
    def address(self) -> str:
        """Every node's address: what a client of the cluster is given."""
        return ",".join(node.address for node in self.nodes)

    def args(self, node: Node) -> list[str]:
        return ["--etcd", self.etcd.endpoints, "--cluster", CLUSTER, "--node", node.name,
                "--cluster-lease-seconds", str(self.lease), "--fsync", "always"]

    async def start(self) -> None:
        await asyncio.to_thread(self.etcd.start)
        await asyncio.gather(*(node.start(*self.args(node)) for node in self.nodes))

    async def restart(self, node: Node) -> None:
        await node.start(*self.args(node))

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes), return_exceptions=True)
        self.etcd.stop()

    def _exited_alone(self) -> list[Node]:
        return [node for node in self.nodes if node.proc is not None
                and node.proc.returncode is not None and not node.stopped_by_us]

    def check_alive(self) -> None:
        """Note any node that exited without being told to (once)."""
        for node in self._exited_alone():
            self.unexpected.append(f"{node.name} exited {node.proc and node.proc.returncode} "
                                   f"({node.logs[-1].name})")
            node.stopped_by_us = True  # noted

    async def revive(self) -> None:
        """Start again every node that exited on its own (a stepped-down primary: 75)."""
        for node in self._exited_alone():
            self.unexpected.append(f"{node.name} exited {node.proc and node.proc.returncode} "
                                   f"on its own ({node.logs[-1].name}); started again")
            await self.restart(node)

    async def primary(self, above: int = 0, among: list[Node] | None = None,
                      timeout: float = PRIMARY_TIMEOUT) -> tuple[Node, int]:
        """The node leading an epoch above ``above`` (from the logs), and the epoch."""
        deadline = time.monotonic() + timeout
        while True:
            for node in among or self.nodes:
                if node.alive and (epoch := node.primary_epoch()) > above:
                    return node, epoch
            if time.monotonic() > deadline:
                raise RuntimeError(f"no primary above epoch {above} within {timeout:g} s:\n"
                                   + "\n".join(f"--- {n.name}\n{n.log()[-1500:]}"
                                               for n in self.nodes))
            await asyncio.sleep(0.02)

    async def copies(self, primary: Node, timeout: float = COPY_TIMEOUT) -> None:
        """Until ``primary``'s log says every other node has its copy and a synchronous
        standby is named."""
        deadline = time.monotonic() + timeout
        others = [node.name for node in self.nodes if node is not primary]
        while True:
            text = primary.log()
            if (all(f"standby {name} has its copy" in text
                    or f"standby {name} resumes after batch" in text for name in others)
                    and "is named the synchronous standby" in text):
                return
            if time.monotonic() > deadline or not primary.alive:
                raise RuntimeError(f"the standbys of {primary.name} did not get their copy "
                                   f"within {timeout:g} s:\n{text[-3000:]}")
            await asyncio.sleep(0.02)

    def log_findings(self) -> list[str]:
        """Lines of every node log with a traceback or an ERROR/CRITICAL event."""
        found = []
        for node in self.nodes:
            for path in node.logs:
                for line in path.read_text(errors="replace").splitlines():
                    if "Traceback" in line or " ERROR " in line or "CRITICAL" in line:
                        found.append(f"{path.name}: {line}")
        return found

    def log_warnings(self) -> dict[str, int]:
        """The nodes' WARNING events, counted by message (numbers and node names made
        alike: ``N``), and the etcd members' leader elections."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            for path in node.logs:
                for line in path.read_text(errors="replace").splitlines():
                    if " WARNING " in line:
                        what = re.sub(r"\bn\d+\b|\d+", "N", line.split(" WARNING ", 1)[1])
                        counts[what] = counts.get(what, 0) + 1
        terms = {term for path in self.etcd.logs for term in re.findall(
            r"elected leader \w+ at term (\d+)", path.read_text(errors="replace"))}
        counts["etcd: raft leader elections (the first one included)"] = len(terms)
        return counts

    def keep_logs(self, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            for path in node.logs:
                shutil.copy(path, where / path.name)
        for path in self.etcd.logs:
            shutil.copy(path, where / f"etcd-{path.name}")


@contextlib.asynccontextmanager
async def running_cluster(lease: int, keep_logs: Path | None = None,
                          make: Callable[[Path, int], Cluster] = Cluster,
                          ) -> AsyncIterator[Cluster]:
    """A started cluster (``make(root, lease)``), with a primary and every standby
    holding its copy; everything stopped at the end, whatever happened (logs copied to
    ``keep_logs`` first)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is not None:  # SIGTERM ends the run as Ctrl-C does: everything stopped first
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with tempfile.TemporaryDirectory(prefix="rsd-bench-cluster-") as where:
        cluster = make(Path(where), lease)
        try:
            await cluster.start()
            primary, _ = await cluster.primary()
            await cluster.copies(primary)
            yield cluster
        finally:
            try:
                await cluster.stop()
            finally:
                cluster.etcd.stop()
                for node in cluster.nodes:
                    if node.alive and node.proc is not None:
                        with contextlib.suppress(ProcessLookupError):
                            node.proc.kill()
                if keep_logs is not None:
                    with contextlib.suppress(OSError):
                        cluster.keep_logs(keep_logs)
                loop.remove_signal_handler(signal.SIGTERM)


# ---- replication lag, from outside --------------------------------------------------------


def journal_record_bytes(directory: Path) -> int:
    """The record bytes in a data directory's journal segments (what ``journal_bytes``
    counts on the primary): closed segments whole (a closed one is cut back to its
    records), the open (last) one without the zeros written ahead of its records."""
    names = segments(os.listdir(directory))
    total = 0
    for i, (_, name) in enumerate(names):
        path = directory / name
        try:
            size = os.stat(path).st_size
            if i == len(names) - 1:
                size = _end_of_records(path, size)
        except FileNotFoundError:
            continue
        total += size
    return total


def _end_of_records(path: Path, size: int) -> int:
    """Where the zeros after the last record begin (read back from the end in chunks)."""
    chunk = 1 << 16
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            data = f.read(end - start).rstrip(b"\0")
            if data:
                return start + len(data)
            end = start
    return 0


@dataclass
class LagSample:
    at: float
    primary_bytes: int
    primary_writes: int
    held_batches: int
    standby_bytes: dict[str, int]
    lag_records: dict[str, int]  # SERVER_STATS' cluster.members[].lag_records (if known)


@dataclass
class Lag:
    """Lag samples over the cluster's load windows (see the module docstring)."""

    records_behind: dict[str, list[int]] = field(default_factory=dict)  # rsd's, per standby
    worst_records: list[int] = field(default_factory=list)  # per sample, the furthest behind
    bytes_behind: dict[str, list[int]] = field(default_factory=dict)  # from outside
    worst: list[int] = field(default_factory=list)  # per sample, the furthest behind
    held_batches: list[int] = field(default_factory=list)
    bytes_per_batch: list[float] = field(default_factory=list)
    catch_up_ms: dict[str, list[float]] = field(default_factory=dict)
    residual: dict[str, int] = field(default_factory=dict)  # bytes behind once settled
    recopies: dict[str, int] = field(default_factory=dict)  # windows cut short by a copy
    notes: list[str] = field(default_factory=list)


class LagProbe:
    """Samples the primary's journal bytes and batches (SERVER_STATS) and each standby's
    journal record bytes, counted from a quiet moment (``calibrate``). A standby that
    takes a new copy meanwhile (its stream was cut: its journal starts over) is left out
    from then on, and said so."""

    def __init__(self, primary: Node, standbys: list[Node]) -> None:
        self.primary = primary
        self.standbys = standbys
        self.client = AsyncRunstate(holder="bench-lag", address=primary.address)
        self.base: LagSample | None = None
        self.copies: dict[str, int] = {}  # copies kept by each standby at calibration
        self.recopied: set[str] = set()

    async def sample(self) -> LagSample:
        stats = await self.client.server_stats()
        journal = stats.get("journal") or {}
        members = (stats.get("cluster") or {}).get("members") or []
        return LagSample(
            time.monotonic(), int(stats["journal_bytes"]), int(journal.get("writes", 0)),
            int(stats.get("held_batches", 0)),
            {node.name: journal_record_bytes(node.data) for node in self.standbys},
            {m["node"]: int(m["lag_records"]) for m in members
             if m.get("role") != "primary" and isinstance(m.get("lag_records"), int)},
        )

    def _copies(self, node: Node) -> int:
        return node.log().count("copy of the primary's state kept")

    def behind(self, now: LagSample, lag: Lag) -> dict[str, int]:
        """Bytes each standby lacks (those that took no new copy since ``calibrate``)."""
        base = self.base
        assert base is not None
        for node in self.standbys:
            if node.name not in self.recopied and self._copies(node) != self.copies[node.name]:
                self.recopied.add(node.name)
                lag.recopies[node.name] = lag.recopies.get(node.name, 0) + 1
        grown = now.primary_bytes - base.primary_bytes
        return {name: grown - (now.standby_bytes[name] - base.standby_bytes[name])
                for name in now.standby_bytes if name not in self.recopied}

    async def calibrate(self, timeout: float = 5.0) -> None:
        """Wait for two samples 0.2 s apart in which nothing moved: every standby then
        holds what the primary journaled (no load runs); count from there."""
        deadline = time.monotonic() + timeout
        last = await self.sample()
        while True:
            await asyncio.sleep(0.2)
            now = await self.sample()
            if (now.primary_bytes == last.primary_bytes
                    and now.standby_bytes == last.standby_bytes) or time.monotonic() > deadline:
                self.base = now
                self.copies = {node.name: self._copies(node) for node in self.standbys}
                self.recopied = set()
                return
            last = now

    async def during(self, lag: Lag, load: asyncio.Future[Any]) -> None:
        """Sample until ``load`` is done, then time each standby's catch-up. A sample not
        answered within 5 s ends the sampling (said so)."""
        try:
            await self._during(lag, load)
        except (TimeoutError, RunstateError) as exc:
            lag.notes.append(f"the lag sampling stopped: {exc!r}")

    async def _during(self, lag: Lag, load: asyncio.Future[Any]) -> None:
        assert self.base is not None
        first: LagSample | None = None
        last: LagSample | None = None
        while not load.done():
            now = await asyncio.wait_for(self.sample(), 5)
            first = first or now
            last = now
            # Below 0: the primary journaled more between its answer and the reading of
            # the standby's files, which hold it already: nothing lacking.
            behind = {name: max(0, value) for name, value in self.behind(now, lag).items()}
            for name, value in behind.items():
                lag.bytes_behind.setdefault(name, []).append(value)
            if behind:
                lag.worst.append(max(behind.values()))
            lag.held_batches.append(now.held_batches)
            for name, value in now.lag_records.items():
                lag.records_behind.setdefault(name, []).append(value)
            if now.lag_records:
                lag.worst_records.append(max(now.lag_records.values()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(load), LAG_SAMPLE_SECONDS)
        if load.exception() is not None:
            return
        if first is not None and last is not None and last.primary_writes > first.primary_writes:
            lag.bytes_per_batch.append((last.primary_bytes - first.primary_bytes)
                                       / (last.primary_writes - first.primary_writes))
        ended = time.monotonic()
        waiting = {node.name for node in self.standbys} - self.recopied
        while waiting and time.monotonic() - ended < CATCH_UP_TIMEOUT:
            now = await asyncio.wait_for(self.sample(), 5)
            for name, value in self.behind(now, lag).items():
                if name in waiting and value <= 0:
                    waiting.discard(name)
                    lag.catch_up_ms.setdefault(name, []).append((now.at - ended) * 1000)
            waiting -= self.recopied
            if waiting:
                await asyncio.sleep(0.01)
        for name in waiting:
            lag.notes.append(f"standby {name} did not catch up within {CATCH_UP_TIMEOUT:g} s "
                             "of the load's end")
        await asyncio.sleep(0.3)  # settled: what is left is the method's error
        for name, value in self.behind(await asyncio.wait_for(self.sample(), 5), lag).items():
            lag.residual[name] = max(lag.residual.get(name, 0), abs(value))

    async def close(self) -> None:
        await self.client.close()


# ---- throughput, single beside cluster ------------------------------------------------------


@dataclass
class Throughput:
    single: float
    cluster: float
    failed: str | None = None  # why the cluster's window failed (then ``cluster`` is 0)

    @property
    def ratio(self) -> float:
        return self.cluster / self.single if self.single else 0.0


async def _with_lag(cluster: Cluster, lag: Lag, work: Callable[[], Any]) -> Any:
    """Run ``work()`` (a coroutine) against the cluster while sampling its lag."""
    primary, _ = await cluster.primary()
    probe = LagProbe(primary, [node for node in cluster.nodes if node is not primary])
    try:
        try:
            await asyncio.wait_for(probe.calibrate(), 10)
        except (TimeoutError, RunstateError) as exc:
            lag.notes.append(f"no lag measured in a window: the probe failed: {exc!r}")
            return await work()
        load = asyncio.ensure_future(work())
        try:
            await probe.during(lag, load)
        except BaseException:
            load.cancel()
            raise
        return await load
    finally:
        await probe.close()


async def throughputs(cluster: Cluster, seconds: float, lag: Lag,
                      progress: Callable[[str], None] = say) -> dict[str, Throughput]:
    """Claims and tasks, each on a fresh single rsd (``--fsync always``) and then on the
    cluster (its client given every node's address), back to back. A cluster window that
    fails (a request that never returns, say) is reported, not raised."""

    async def claims_on(address: str) -> float:
        return await claims.throughput(address, CLIENTS, seconds)

    async def tasks_on(address: str) -> float:
        rate, _ = await tasks.measure(address, seconds, CLIENTS, CLIENTS)
        return rate

    out: dict[str, Throughput] = {}
    for what, work in (("claims", claims_on), ("tasks", tasks_on)):
        async with rsd_process("--fsync", "always") as single:
            progress(f"  {what}, single rsd ...")
            alone = await work(single.address)
        progress(f"  {what}, cluster ...")
        try:
            together = await _with_lag(cluster, lag, functools.partial(work, cluster.address))
            out[what] = Throughput(alone, together)
        except (RunstateError, RuntimeError, TimeoutError) as exc:
            progress(f"  {what}, cluster: failed: {type(exc).__name__}: {exc}")
            out[what] = Throughput(alone, 0.0, f"{type(exc).__name__}: {str(exc)[:300]}")
    return out


# ---- takeover ---------------------------------------------------------------------------


@dataclass
class Takeover:
    """One kill of the primary."""

    killed: str
    epoch: int  # the epoch the new primary leads
    new_primary: str
    elected: float  # seconds from the kill to the new primary's log line
    named: float | None  # ... to its log line naming a synchronous standby
    first_ack: float  # seconds from the kill to the first acknowledged submit sent after it
    rejoined: float  # seconds from the restart of the killed node to both copies
    etcd_elections: int | None  # etcd leader elections between the kill and the new primary


@dataclass
class Takeovers:
    done: list[Takeover] = field(default_factory=list)
    asked: int = 0
    acknowledged: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # submits that raised, by error
    verified: int = 0
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Submitter:
    """One client of every node's address submitting keyed tasks in a loop; remembers
    when each acknowledged submit was sent and answered."""

    def __init__(self, address: str) -> None:
        # Long enough to reconnect across a takeover (it waits for the new primary).
        self.rs = AsyncRunstate(holder="bench-takeover", address=address,
                                connect_timeout=TAKEOVER_GIVE_UP)
        self.acks: list[tuple[float, float]] = []  # (sent, answered), monotonic
        self.acknowledged: dict[str, str] = {}  # key -> task id
        self.errors: dict[str, int] = {}
        self.run_id = ""
        self.answered = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.rs.mailboxes.ensure("bench-takeover", mode="WORK")
        run = await self.rs.scopes.create()
        self.run_id = run.id
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        mailbox = self.rs.scope(self.run_id).mailbox("bench-takeover")
        n = 0
        while not self._stop.is_set():
            n += 1
            key = f"t{n}"
            sent = time.monotonic()
            try:
                ticket = await mailbox.submit({"n": n}, key=key, slim=True)
            except RunstateError as exc:
                name = f"{type(exc).__name__}({getattr(exc, 'code', '')})"
                self.errors[name] = self.errors.get(name, 0) + 1
                await asyncio.sleep(0.05)
                continue
            self.acks.append((sent, time.monotonic()))
            self.acknowledged[key] = ticket.id
            self.answered.set()

    async def first_ack_after(self, instant: float, timeout: float) -> float | None:
        """When the first submit sent after ``instant`` was acknowledged (None: none
        within ``timeout``)."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for sent, answered in self.acks[checked:]:
                if sent > instant:
                    return answered
            checked = len(self.acks)
            self.answered.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.answered.wait(), left)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 30)

    async def verify(self, sample: int, out: Takeovers) -> None:
        """A sample of the acknowledged submits (the last ones included): each task is
        on the cluster under the id it was acknowledged with."""
        keys = sorted(self.acknowledged, key=lambda k: int(k[1:]))
        step = max(1, len(keys) // sample)
        chosen = keys[::step][:sample] + keys[-10:]
        run = self.rs.scope(self.run_id)

        async def one(key: str) -> None:
            try:
                view = await run.task(self.acknowledged[key]).status()
                if view.get("key") != key:
                    out.missing.append(key)
            except RunstateError as exc:
                out.missing.append(f"{key} ({type(exc).__name__})")

        await asyncio.gather(*(one(key) for key in set(chosen)))
        out.verified = len(set(chosen))

    async def close(self) -> None:
        await self.rs.close()


async def _one_kill(cluster: Cluster, submitter: Submitter, k: int, kills: int,
                    progress: Callable[[str], None]) -> Takeover | str:
    """Kill the primary once (see the module docstring); the takeover, or why it failed."""
    await cluster.revive()
    primary, epoch = await cluster.primary()
    await cluster.copies(primary)
    # Something acknowledged in this epoch with every standby in place.
    if await submitter.first_ack_after(time.monotonic(), 10) is None:
        return f"before kill {k + 1}: nothing acknowledged for 10 s (the cluster is stuck)"
    term = await asyncio.to_thread(cluster.etcd.raft_term)
    killed_at = time.monotonic()
    await primary.kill()
    survivors = [node for node in cluster.nodes if node is not primary]
    successor, new_epoch = await cluster.primary(epoch, survivors, TAKEOVER_GIVE_UP)
    elected = time.monotonic() - killed_at
    term_after = await asyncio.to_thread(cluster.etcd.raft_term)
    named = asyncio.ensure_future(_seen(successor, "is named the synchronous standby",
                                        TAKEOVER_GIVE_UP))
    answered = await submitter.first_ack_after(killed_at,
                                               max(0.0, TAKEOVER_GIVE_UP - elected))
    named_at: float | None = None
    if answered is not None:
        with contextlib.suppress(TimeoutError):
            named_at = await asyncio.wait_for(asyncio.shield(named), 5)
    named.cancel()
    if answered is None:
        return f"kill {k + 1}: nothing acknowledged within {TAKEOVER_GIVE_UP:g} s of the kill"
    restarted = time.monotonic()
    await cluster.restart(primary)
    await cluster.copies(successor)
    done = Takeover(primary.name, new_epoch, successor.name, elected,
                    None if named_at is None else named_at - killed_at, answered - killed_at,
                    time.monotonic() - restarted,
                    None if term is None or term_after is None else term_after - term)
    sync = "-" if done.named is None else f"{done.named:.2f} s"
    etcd = "" if not done.etcd_elections else (
        f" (etcd elected a leader {done.etcd_elections} time(s) meanwhile)")
    progress(f"  kill {k + 1}/{kills}: {done.killed} killed, {done.new_primary} leads epoch "
             f"{done.epoch}: elected after {done.elected:.2f} s{etcd}, a synchronous standby "
             f"named after {sync}, first acknowledged change after {done.first_ack:.2f} s; "
             f"{done.killed} back with its copy {done.rejoined:.2f} s after its restart")
    return done


async def takeovers(cluster: Cluster, kills: int,
                    progress: Callable[[str], None] = say) -> Takeovers:
    """``kills`` kills of the primary under a submitting client; stops at the first that
    fails (no new primary, nothing acknowledged, a standby without its copy)."""
    out = Takeovers(asked=kills)
    submitter = Submitter(cluster.address)
    try:
        try:
            await asyncio.wait_for(submitter.start(), 30)
        except TimeoutError:
            out.notes.append("the submitting client could not start within 30 s")
            return out
        for k in range(kills):
            try:
                done = await _one_kill(cluster, submitter, k, kills, progress)
            except RuntimeError as exc:
                done = f"kill {k + 1}: {str(exc)[:3000]}"
            if isinstance(done, str):
                progress(f"  {done.splitlines()[0]}")
                out.notes.append(done)
                break
            out.done.append(done)
        await submitter.stop()
        out.acknowledged = len(submitter.acknowledged)
        out.errors = dict(submitter.errors)
        try:
            await asyncio.wait_for(submitter.verify(VERIFY_SAMPLE, out), 60)
        except (TimeoutError, RunstateError) as exc:
            out.notes.append(f"the check of the acknowledged submits failed: {exc!r}")
    finally:
        await submitter.stop()
        await submitter.close()
    return out


# ---- the whole measurement --------------------------------------------------------------


@dataclass
class ClusterFigures:
    seconds: float
    lease: int
    throughput: dict[str, Throughput]
    lag: Lag
    takeover: Takeovers
    log_findings: list[str]
    log_warnings: dict[str, int]
    unexpected_exits: list[str]
    took: float

    @property
    def target(self) -> float:
        return 2 * self.lease + 1.0


async def measure(seconds: float, kills: int, lease: int = DEFAULT_LEASE,
                  keep_logs: Path | None = None,
                  progress: Callable[[str], None] = say) -> ClusterFigures:
    """Start the cluster, measure throughput (beside a single rsd) with the lag, then the
    takeovers; stop everything."""
    started = time.monotonic()
    progress(f"starting 3 etcd members and 3 rsd nodes (--fsync always, cluster lease "
             f"{lease} s) ...")
    async with running_cluster(lease, keep_logs) as cluster:
        progress(f"  cluster up after {time.monotonic() - started:.1f} s: {cluster.address}")
        lag = Lag()
        rates = await throughputs(cluster, seconds, lag, progress)
        cluster.check_alive()
        progress(f"takeovers: {kills} kills of the primary (SIGKILL) ...")
        taken = await takeovers(cluster, kills, progress)
        cluster.check_alive()
        findings = cluster.log_findings()
        warnings = cluster.log_warnings()
        unexpected = cluster.unexpected
    return ClusterFigures(seconds, lease, rates, lag, taken, findings, warnings, unexpected,
                          time.monotonic() - started)


def report(figs: ClusterFigures) -> str:
    lines = []
    for what, unit in (("claims", "pairs/s"), ("tasks", "tasks/s")):
        t = figs.throughput[what]
        if t.failed:
            lines.append(f"{what} ({unit}): single rsd {t.single:,.0f}, cluster: the window "
                         f"failed ({t.failed})")
            continue
        verdict = "met" if t.ratio >= 0.5 else "missed"
        lines.append(f"{what} ({unit}): single rsd {t.single:,.0f}, cluster {t.cluster:,.0f}, "
                     f"cluster/single {t.ratio:.2f}x (target >= 0.5x: {verdict})")
    done = figs.takeover.done
    if done:
        firsts = [t.first_ack for t in done]
        elected = [t.elected for t in done]
        rejoined = [t.rejoined for t in done]
        p50, worst = statistics.median(firsts), max(firsts)
        verdict = "met" if worst <= figs.target else "missed"
        lines.append(
            f"takeover, kill -9 of the primary -> first acknowledged change on the new "
            f"primary, over {len(done)} kill(s): p50 {p50:.2f} s, max {worst:.2f} s, min "
            f"{min(firsts):.2f} s (target <= 2 x {figs.lease} s + 1 s = {figs.target:g} s: "
            f"{verdict} for {sum(f <= figs.target for f in firsts)} of {len(firsts)})")
        named = [t.named for t in done if t.named is not None]
        lines.append(f"  of which the election (kill -> the new primary's log line): p50 "
                     f"{statistics.median(elected):.2f} s, max {max(elected):.2f} s"
                     + (f"; kill -> a synchronous standby named: p50 "
                        f"{statistics.median(named):.2f} s, max {max(named):.2f} s"
                        if named else "")
                     + f"; a restarted node had its copy after p50 "
                     f"{statistics.median(rejoined):.2f} s, max {max(rejoined):.2f} s")
        slow = [t for t in done if t.first_ack > figs.target]
        moved = [t for t in done if t.etcd_elections]
        lines.append(f"  etcd elected a leader during {len(moved)} of {len(done)} takeovers"
                     + (f" (first acknowledged change then: "
                        f"{', '.join(f'{t.first_ack:.1f} s' for t in moved)})" if moved else "")
                     + f"; over the target: {len(slow)}"
                     + (f" (elections {', '.join(f'{t.elected:.1f} s' for t in slow)})"
                        if slow else ""))
    tk = figs.takeover
    lines.append(f"  {tk.acknowledged:,} submits acknowledged during the kills; submits that "
                 f"raised: {tk.errors or 'none'}; {tk.verified} acknowledged checked on the "
                 f"last primary, missing: {tk.missing or 'none'}")
    lines += [f"  {note}" for note in tk.notes]
    lag = figs.lag
    lines.append(f"replication lag under the cluster's load (the claims and tasks windows), "
                 f"sampled every {LAG_SAMPLE_SECONDS:g} s")
    worst_records = lag.worst_records
    if worst_records:
        lines.append(f"  as rsd reports it (SERVER_STATS cluster.members[].lag_records: records "
                     f"the primary has that a standby has not acknowledged), the standby "
                     f"furthest behind, {len(worst_records)} samples: p50 "
                     f"{_pct(worst_records, 0.5):,.0f}, p99 {_pct(worst_records, 0.99):,.0f}, "
                     f"max {max(worst_records):,} records")
        for name, values in sorted(lag.records_behind.items()):
            lines.append(f"    standby {name}: p50 {_pct(values, 0.5):,.0f}, p99 "
                         f"{_pct(values, 0.99):,.0f}, max {max(values):,} records")
    else:
        lines.append("  rsd reports no lag (no lag_records in SERVER_STATS' cluster)")
    worst_lag = lag.worst
    if worst_lag:
        per_batch = statistics.median(lag.bytes_per_batch) if lag.bytes_per_batch else 0.0
        in_batches = (f" (about {_pct(worst_lag, 0.5) / per_batch:.1f} / "
                      f"{max(worst_lag) / per_batch:.1f} batches of {per_batch:,.0f} "
                      f"bytes)") if per_batch else ""
        lines.append(f"  measured from outside (journal bytes written by the primary and not "
                     f"yet by a standby), the standby furthest behind, {len(worst_lag)} "
                     f"samples: p50 {_pct(worst_lag, 0.5):,.0f}, p99 "
                     f"{_pct(worst_lag, 0.99):,.0f}, max {max(worst_lag):,}{in_batches}")
        for name, values in sorted(lag.bytes_behind.items()):
            catch = lag.catch_up_ms.get(name, [])
            caught = f"{max(catch):.0f} ms after the load's end" if catch else "-"
            lines.append(f"    standby {name}: p50 {_pct(values, 0.5):,.0f} bytes, max "
                         f"{max(values):,}; held everything {caught} (worst window); once "
                         f"settled {lag.residual.get(name, 0)} bytes off (the method's error)")
    if lag.held_batches:
        held = lag.held_batches
        lines.append(f"  the primary's held batches (replies waiting for its fsync and the "
                     f"synchronous standby's): p50 {_pct(held, 0.5):.0f}, max {max(held)}")
    for name, count in sorted(lag.recopies.items()):
        lines.append(f"  standby {name} took a new copy during {count} load window(s) (its "
                     f"stream was cut): left out of the bytes from then on")
    lines += [f"  {note}" for note in lag.notes]
    lines.append(f"node logs: {len(figs.log_findings)} line(s) with Traceback/ERROR/CRITICAL")
    kinds: dict[str, list[str]] = {}
    for line in figs.log_findings:
        kinds.setdefault(_signature(line), []).append(line.split(":", 1)[0])
    for kind, where in sorted(kinds.items(), key=lambda kv: -len(kv[1]))[:LOG_LINES_SHOWN]:
        lines.append(f"  {len(where)} x {kind} (in {', '.join(sorted(set(where)))})")
    lines.append("warnings in the logs: " + ("; ".join(
        f"{count} x {what}" for what, count in sorted(figs.log_warnings.items(),
                                                      key=lambda kv: -kv[1])) or "none"))
    lines.append("exits nobody asked for: " + ("; ".join(figs.unexpected_exits) or "none"))
    lines.append(f"took {figs.took:.0f} s")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_KILLS} kills, 1 s windows")
    parser.add_argument("--kills", type=int,
                        help=f"kills of the primary (default {DEFAULT_KILLS}; "
                        f"{QUICK_KILLS} quick)")
    parser.add_argument("--seconds", type=float,
                        help="time per throughput window (default 3; 1 quick)")
    parser.add_argument("--lease-seconds", type=int, default=DEFAULT_LEASE,
                        help="--cluster-lease-seconds of the nodes (default 5)")
    parser.add_argument("--logs", type=Path,
                        help="copy the node and etcd logs here at the end")
    args = parser.parse_args(argv)
    args.kills = args.kills if args.kills is not None else (
        QUICK_KILLS if args.quick else DEFAULT_KILLS)
    args.seconds = args.seconds or (1.0 if args.quick else 3.0)
    if args.kills < 0 or args.seconds <= 0 or args.lease_seconds < 1:
        parser.error("--kills must be >= 0, --seconds > 0, --lease-seconds >= 1")
    return args


async def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    figs = await measure(args.seconds, args.kills, args.lease_seconds, args.logs)
    print(f"rsd cluster bench, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end, "
          f"{args.seconds:g} s per throughput window")
    print(report(figs))
    if args.logs:
        print(f"logs: {args.logs}")


def _run() -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


if __name__ == "__main__":
    try:
        _run()
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("interrupted: every process this run started is stopped")
        sys.exit(130)
