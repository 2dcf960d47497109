"""Real etcd clusters for the tests: N members on loopback ports of their own.

``EtcdCluster(root, size)`` starts ``size`` members of Debian's etcd 3.4 (``/usr/bin/etcd``;
``make test`` installs it), each with a data directory under ``root`` and a log file
beside it, and waits until every member says it is healthy. A member can be killed
(SIGKILL), paused (SIGSTOP), resumed (SIGCONT) and restarted on its ports; ``stop`` ends
them all (SIGKILL), paused ones included. With ``certs`` (support/certs.py) the members serve their
clients over TLS and require a client certificate signed by that CA.

Ports: etcd must be told its client and peer ports before it binds them, so each start
picks them by binding port 0 (all at once, so they differ), closes the probes and hands
the numbers over; a member that then finds its port taken (another process got it in
between) exits, and the whole cluster is started again on new ports. A member restarts on
the ports it had. Members are started with ``--grpc-keepalive-min-time=1s``, which rsd's
etcd client needs (rsd/cluster/client.py), and a cluster token of their own, so two
clusters of one test run never talk to each other.

Timing: etcd's raft clock is the cluster's ``timing`` (``EtcdTiming``), ``QUICK`` unless
the cluster is made with another: a leader is elected sooner at start and after the
leader is killed, paused or cut off (every test that fails etcd waits for that), and
etcd's shortest lease is 1 s, not 2. See ``QUICK`` for what it is and why it is safe on a
loaded machine.

With ``host`` and ``wrap`` the members listen on another address than 127.0.0.1, each
started as ``[*wrap, etcd, ...]``: in a network namespace of a partition test
(support/netns.py: ``host.address`` and ``host.command()``; the ports picked as above
are free there too, a new namespace has none taken).

``stores(endpoints, *nodes)`` gives connected ``EtcdStore``s (rsd/cluster/etcd.py), one
per node name, closed at the end of the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .certs import Certs

if TYPE_CHECKING:  # conftest imports this module: grpc is loaded by the etcd tests only
    from rsd.cluster.etcd import EtcdStore

START_TIMEOUT = 20.0  # seconds for every member to be healthy (two workers, 2 cores)
STOP_TIMEOUT = 5.0  # seconds for a killed member to be gone
ATTEMPTS = 4  # starts on fresh ports before giving up
HOW_TO_INSTALL = ("etcd is not installed: `make test` installs Debian's etcd-server, or "
                  "run `apt-get install etcd-server` as root")


def etcd_binary() -> str:
    """The etcd server binary; the test fails, saying how to install it, if there is none."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd")
                                     else None)
    if found is None:
        pytest.fail(HOW_TO_INSTALL)
    return found


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of ``pid`` is stopped (state T or t in /proc), or it is gone."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for task in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return  # gone (or a thread ended while read): nothing runs there
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"etcd {pid} did not stop within {timeout} s of SIGSTOP")


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


@dataclass(frozen=True)
class EtcdTiming:
    """etcd's raft clock: a leader's heartbeat every ``heartbeat_ms``, and a follower
    that heard none for ``election_ms`` (randomized up to twice that) campaigns; etcd's
    shortest lease is 1.5 election timeouts (rounded up to a second), and a new leader
    extends every lease by one. ``pre_vote``: a member first asks whether it could win
    (etcd 3.5's default), so one that was stalled and wakes does not depose a leader the
    others still hear. etcd 3.4's own: 100 ms, 1000 ms, no pre-vote."""

    heartbeat_ms: int
    election_ms: int
    pre_vote: bool = False

    def flags(self) -> list[str]:
        return ["--heartbeat-interval", str(self.heartbeat_ms),
                "--election-timeout", str(self.election_ms),
                f"--pre-vote={'true' if self.pre_vote else 'false'}"]  # (a bool: one word)


# The tests' clock: a start elected in 0.15 s (one member; 0.3 s for three) instead of
# 0.5 s, and a new leader 0.2-0.4 s after the leader is killed, paused or cut off instead
# of 1-1.6 s (measured on the 2-core machine). Safe on a loaded machine: a leader stalled
# for 200-400 ms makes its followers campaign, but that election is over in about as
# long, within the second rsd gives each call to etcd at the least (MIN_CALL_TIMEOUT);
# and with pre-vote a follower that was itself stalled asks first, and does not depose a
# leader the others still hear. In 11 runs of the etcd tests (3 pytest workers beside two
# CPU burners, load 8-18) no three-member cluster changed leaders but where a test killed
# or paused one (etcd_server_leader_changes_seen_total of each member at the end); twice
# a member lost sight of its leader and found it again, which pre-vote made no election.
# Peers are always near (loopback, or one network namespace): the far tests delay only
# the clients' side (support/proxy.py).
QUICK = EtcdTiming(heartbeat_ms=20, election_ms=200, pre_vote=True)


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """``size`` etcd members on loopback (see the module docstring)."""

    def __init__(self, root: Path, size: int = 3, certs: Certs | None = None,
                 host: str = "127.0.0.1", wrap: Sequence[str] = (),
                 timing: EtcdTiming = QUICK) -> None:
        self.root = root
        self.size = size
        self.certs = certs
        self.host = host
        self.wrap = list(wrap)
        self.timing = timing
        self.members: list[EtcdMember] = []
        self.binary = etcd_binary()
        self._health_context: ssl.SSLContext | None = None
        if certs is not None:
            self._health_context = certs.client_context("etcd-health")

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    # ---- starting ----------------------------------------------------------------------

    def start(self) -> EtcdCluster:
        """Start every member on fresh ports and wait until all are healthy."""
        for attempt in range(ATTEMPTS):
            ports = _free_ports(2 * self.size)
            token = f"rsd-test-{uuid.uuid4().hex[:12]}"
            here = self.root / f"try{attempt}"
            self.members = [
                EtcdMember(f"e{n}", ports[2 * n], ports[2 * n + 1], here / f"e{n}.data",
                           here / f"e{n}.log", self.host)
                for n in range(self.size)
            ]
            here.mkdir(parents=True, exist_ok=True)
            if self._spawn_in_turn(token) and self._wait_healthy(self.members):
                return self
            taken = any("address already in use" in self.log(m) for m in self.members)
            self.stop()
            if not taken:
                break
        pytest.fail(f"etcd did not start; logs:\n{self.logs()}")

    def _spawn_in_turn(self, token: str) -> bool:
        """Start the members one after the other, each once the one before serves its
        peers; False if one exits first. Why not all at once: a new member first asks
        its peers whether it was bootstrapped already (etcd 3.4's isMemberBootstrapped),
        one after the other with a 1 s timeout each, and a peer that has bound its port
        but does not serve yet holds the question for all of it: 2 s per start of three.
        A peer not started refuses at once, and one that serves answers at once."""
        deadline = time.monotonic() + START_TIMEOUT
        for n, member in enumerate(self.members):
            self._spawn(member, "new", token)
            while n < self.size - 1 and not self._serves_peers(member):
                if not member.running() or time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
        return True

    def _serves_peers(self, member: EtcdMember) -> bool:
        """Whether the member answers on its peer port (it has started its server)."""
        url = f"http://{member.host}:{member.peer_port}/members"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                return bool(reply.status == 200)
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _scheme(self) -> str:
        return "https" if self.certs is not None else "http"

    def _spawn(self, member: EtcdMember, state: str, token: str = "") -> None:
        scheme = self._scheme()
        client_url = f"{scheme}://{member.host}:{member.client_port}"
        peer_url = f"http://{member.host}:{member.peer_port}"
        cluster = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in self.members)
        argv = [
            *self.wrap,
            self.binary,
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", state,
            "--grpc-keepalive-min-time", "1s",
            *self.timing.flags(),
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
        ]
        if token:
            argv += ["--initial-cluster-token", token]
        if self.certs is not None:
            argv += [
                "--cert-file", str(self.certs.cert_file),
                "--key-file", str(self.certs.key_file),
                "--trusted-ca-file", str(self.certs.ca_file),
                "--client-cert-auth",
            ]
        with open(member.log_path, "ab") as log_file:  # the child holds its own copy
            member.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                           stdout=log_file, stderr=log_file)
        member.paused = False

    def healthy(self, member: EtcdMember) -> bool:
        """Whether the member answers its health check (it has a leader, it serves)."""
        url = f"{self._scheme()}://{member.host}:{member.client_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0,
                                        context=self._health_context) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _wait_healthy(self, members: list[EtcdMember]) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        waiting = list(members)
        while waiting and time.monotonic() < deadline:
            if any(not member.running() for member in waiting):
                return False
            # Asked at once: a member without a leader yet holds the question for the
            # whole timeout.
            with ThreadPoolExecutor(len(waiting)) as pool:
                answers = list(pool.map(self.healthy, waiting))
            waiting = [member for member, ok in zip(waiting, answers, strict=True) if not ok]
            if waiting:
                time.sleep(0.05)
        return not waiting

    # ---- faults ------------------------------------------------------------------------

    def kill(self, n: int) -> None:
        """SIGKILL member ``n`` and wait for it to be gone."""
        member = self.members[n]
        assert member.proc is not None
        member.proc.send_signal(signal.SIGKILL)
        member.proc.wait(STOP_TIMEOUT)
        member.paused = False

    def pause(self, *which: int) -> None:
        """SIGSTOP members (all of them without arguments), and wait until every thread
        of each has stopped: kill() returns before a busy thread is stopped, and a
        request that reaches the member meanwhile is still answered."""
        for n in which or range(self.size):
            member = self.members[n]
            if member.running():
                os.kill(member.pid, signal.SIGSTOP)
                member.paused = True
                _wait_stopped(member.pid)

    def resume(self, *which: int) -> None:
        """SIGCONT members (all of them without arguments)."""
        for n in which or range(self.size):
            member = self.members[n]
            if member.running():
                os.kill(member.pid, signal.SIGCONT)
            member.paused = False

    def restart(self, n: int) -> None:
        """Start member ``n`` again (after ``kill``) on its ports and data; wait until it
        is healthy."""
        member = self.members[n]
        assert not member.running(), "kill it first"
        self._spawn(member, "existing")
        if not self._wait_healthy([member]):
            pytest.fail(f"etcd member {member.name} did not restart; log:\n{self.log(member)}")

    # ---- stopping ----------------------------------------------------------------------

    def stop(self) -> None:
        """End every member, paused ones included: SIGKILL (the data is thrown away, and
        a graceful stop of a whole cluster waits seconds for a leadership transfer)."""
        for member in self.members:
            if member.running():
                assert member.proc is not None
                member.proc.kill()
        for member in self.members:
            if member.proc is not None:
                member.proc.wait(STOP_TIMEOUT)

    def log(self, member: EtcdMember) -> str:
        try:
            return member.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def logs(self) -> str:
        return "\n".join(f"--- {m.name} ({m.endpoint})\n{self.log(m)[-3000:]}"
                         for m in self.members)


@contextlib.asynccontextmanager
async def stores(
    endpoints: Sequence[str], *nodes: str, cluster: str = "test", **options: Any
) -> AsyncIterator[list[EtcdStore]]:
    """A connected store per node name (``options`` go to each ``EtcdStore``), all
    closed at the end (their leases left to expire, as after a crash)."""
    from rsd.cluster.etcd import EtcdStore

    made = [EtcdStore(endpoints, cluster, node, **options) for node in nodes]
    try:
        for store in made:
            await store.connect()
        yield made
    finally:
        for store in made:
            await store.close()
