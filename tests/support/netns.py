"""Network namespaces for the partition tests: each rsd node, and the etcd members, on a
network of their own, cut from each other by nft rules as a real network fails.

A ``Network`` is one Linux bridge in the root namespace and one network namespace per
host (``Network(["etcd", "n0", "n1", "n2"])``), each joined to the bridge by a veth
pair: the namespace's end is its ``eth0``, with an address of one /24 of 198.18.0.0/15
(RFC 2544's range for benchmarking networks, which is never routed beyond a machine);
the bridge holds ``.1`` of that /24, the test process's own address on it (``client``).
Traffic stays inside what the test made: a host's only interface besides loopback is
its ``eth0`` on the bridge, with no route beyond the /24, and the root namespace gains
only the bridge's /24. A process runs in a host with ``host.command(*argv)`` (``ip netns
exec NAME ...``, which execs it: the pid is the program's own, for signals).

**Cuts** are nft rules in a table of the host's own namespace (``netdev`` family), on
its ``eth0``'s ingress and egress hooks: ``block`` drops the packets from and to some
addresses (both ways, or one direction, or one TCP port's), ``isolate`` every IP packet,
``heal`` ends them all. Every rule of a cut lives on the cut host's side, and nothing is
added to the root namespace's ruleset. A packet dropped at egress is lost silently, as
on a broken wire (TCP retransmits, a connect times out); a rule in the output hook would
fail the sender's call at once with EPERM, which no partition does.

**Cleanup.** Every name begins ``rsdt-<pid>-<n>`` (``PREFIX``, the test process's pid
in base 36, a counter): ``close`` ends every process left in the namespaces (the test
stops its own first), deletes them (their veths go with them) and the bridge. A run
killed before its ``close`` leaves its names behind: each new ``Network`` first sweeps
the names whose process is gone (``sweep``). A /24 is taken under a file lock, among
those no bridge of the root namespace holds, so networks of concurrent workers never
share one.

``unavailable()`` says why namespaces cannot be made here (not root, no CAP_NET_ADMIN,
``ip`` or ``nft`` missing, a kernel without nft's egress hook), or None: the tests skip
with that reason (``require``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pytest

__all__ = ["PREFIX", "Host", "Network", "require", "sweep", "unavailable"]

PREFIX = "rsdt-"
SPACE = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: never routed beyond a machine
LOCK = Path(tempfile.gettempdir()) / "rsd-test-netns.lock"
TABLE = "rsdt"  # the nft table in each host's namespace
IFNAMSIZ = 15  # the longest interface name Linux takes
HOW_TO_INSTALL = ("`make test` installs them (Debian's iproute2 and nftables), or run "
                  "`apt-get install iproute2 nftables` as root")
_COUNTER = iter(range(1 << 30))
_OWNER = re.compile(rf"^{re.escape(PREFIX)}([0-9a-z]+)-")
_INET = re.compile(r"\binet (\d+\.\d+\.\d+\.\d+)/\d+")


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if not number:
            return text


def _run(*argv: str, stdin: str | None = None) -> str:
    """Run a command (``ip``, ``nft``); its output, or AssertionError with what it said."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): "
                             f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _table(device: str) -> str:
    """The nft table of a host: its eth0's ingress and egress chains, empty."""
    return (f"table netdev {TABLE} {{\n"
            f"  chain ingress {{ type filter hook ingress device \"{device}\" priority 0; "
            "policy accept; }\n"
            f"  chain egress {{ type filter hook egress device \"{device}\" priority 0; "
            "policy accept; }\n"
            "}\n")


@functools.cache
def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None (checked once per process, by
    making one namespace with the table a host has)."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_NET_ADMIN); running as uid {os.geteuid()}"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found: {HOW_TO_INSTALL}"
    probe = f"{PREFIX}{_base36(os.getpid())}-probe"
    try:
        _run("ip", "netns", "add", probe)
    except AssertionError as exc:
        return f"cannot make a network namespace (no CAP_NET_ADMIN here?): {exc}"
    try:
        _run("ip", "netns", "exec", probe, "nft", "-f", "-", stdin=_table("lo"))
    except AssertionError as exc:
        return f"nft cannot filter a device's egress here (Linux 5.16 or later needed): {exc}"
    finally:
        with contextlib.suppress(AssertionError):
            _run("ip", "netns", "del", probe)
    return None


def require() -> None:
    """Skip the calling test, saying why, where namespaces cannot be made."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


def _owner_gone(name: str) -> bool:
    """Whether ``name`` is one of ours whose test process is gone."""
    match = _OWNER.match(name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1), 36), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def _end_processes(netns: str) -> None:
    """SIGKILL every process left in a namespace, and close the sockets they left: a
    closed TCP connection whose peer is gone would otherwise resend its FIN for minutes,
    and the namespace (with its veth in the root namespace) lives until it gives up."""
    with contextlib.suppress(AssertionError):
        deadline = time.monotonic() + 5.0
        while (pids := _run("ip", "netns", "pids", netns).split()) and (
                time.monotonic() < deadline):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)
        _run("ip", "netns", "exec", netns, "ss", "--kill", "--tcp", "--all")


def sweep() -> list[str]:
    """Remove what killed earlier runs left (namespaces with their processes, bridges):
    the names of ours whose owner is gone. The names removed."""
    removed = []
    for line in _run("ip", "netns", "list").splitlines():
        name = line.split(" ", 1)[0]
        if _owner_gone(name):
            _end_processes(name)
            with contextlib.suppress(AssertionError):
                _run("ip", "netns", "del", name)
                removed.append(name)
    for line in _run("ip", "-o", "link", "show").splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if _owner_gone(name):
            with contextlib.suppress(AssertionError):
                _run("ip", "link", "del", name)
                removed.append(name)
    return removed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of ``SPACE`` that no address of the root namespace is in (call locked)."""
    taken = {ipaddress.ip_network(f"{address}/24", strict=False)
             for address in _INET.findall(_run("ip", "-o", "-4", "addr", "show"))}
    for subnet in SPACE.subnets(new_prefix=24):
        if subnet not in taken:
            assert isinstance(subnet, ipaddress.IPv4Network)
            return subnet
    raise AssertionError(f"every /24 of {SPACE} is taken by a bridge: sweep()")


class Host:
    """One network namespace on the bridge: ``name`` (as the test calls it), ``netns``
    (the namespace's name), ``address`` (its eth0's)."""

    def __init__(self, name: str, netns: str, address: str) -> None:
        self.name = name
        self.netns = netns
        self.address = address

    def __repr__(self) -> str:
        return f"<host {self.name} {self.address} in {self.netns}>"

    def command(self, *argv: str) -> list[str]:
        """``argv`` run in this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def _nft(self, *rules: str) -> None:
        _run(*self.command("nft", "-f", "-"), stdin="".join(f"{rule}\n" for rule in rules))

    def block(self, *peers: str, inbound: bool = True, outbound: bool = True,
              port: int | None = None) -> None:
        """Drop the packets from ``peers`` (addresses) to this host (``inbound``) and
        from this host to them (``outbound``); with ``port``, only those to this host's
        TCP ``port`` (inbound) and from it (outbound)."""
        assert peers and (inbound or outbound)
        to_set = "{ " + ", ".join(peers) + " }"
        rules = []
        if inbound:
            tcp = f" tcp dport {port}" if port is not None else ""
            rules.append(f"add rule netdev {TABLE} ingress ip saddr {to_set}{tcp} drop")
        if outbound:
            tcp = f" tcp sport {port}" if port is not None else ""
            rules.append(f"add rule netdev {TABLE} egress ip daddr {to_set}{tcp} drop")
        self._nft(*rules)

    def isolate(self) -> None:
        """Drop every IP packet to and from this host (loopback apart)."""
        self._nft(f"add rule netdev {TABLE} ingress meta protocol ip drop",
                  f"add rule netdev {TABLE} egress meta protocol ip drop")

    def heal(self) -> None:
        """End every cut of this host."""
        self._nft(f"flush chain netdev {TABLE} ingress", f"flush chain netdev {TABLE} egress")


class Network:
    """A bridge, and one namespace per host name on it (see the module docstring)."""

    def __init__(self, hosts: Sequence[str]) -> None:
        assert len(hosts) <= 250 and len(set(hosts)) == len(hosts)
        self.names = list(hosts)
        self.tag = f"{PREFIX}{_base36(os.getpid())}-{_base36(next(_COUNTER))}"
        self.bridge = f"{self.tag}b"
        self.client = ""
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []  # namespaces made, for close

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def start(self) -> Network:
        """Make the bridge and every host (sweeping an earlier run's leftovers first)."""
        require()
        sweep()
        with _locked():
            subnet = _free_subnet()
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self.client = str(subnet.network_address + 1)  # (close deletes the bridge)
            _run("ip", "addr", "add", f"{self.client}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            netns, veth = f"{self.tag}-{name}", f"{self.tag}v{i}"
            assert len(veth) <= IFNAMSIZ, veth
            address = str(subnet.network_address + 2 + i)
            _run("ip", "netns", "add", netns)
            self._made.append(netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", netns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _run("ip", "-n", netns, "link", "set", "eth0", "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
            host = Host(name, netns, address)
            host._nft(_table("eth0"))
            self.hosts[name] = host
        return self

    def heal(self) -> None:
        """End every cut of every host."""
        for host in self.hosts.values():
            host.heal()

    def close(self) -> None:
        """End every process left in the namespaces, delete them and the bridge."""
        problems = []
        for netns in self._made:
            _end_processes(netns)
            try:
                _run("ip", "netns", "del", netns)
            except AssertionError as exc:
                problems.append(str(exc))
        self._made.clear()
        if self.client:
            try:
                _run("ip", "link", "del", self.bridge)
            except AssertionError as exc:
                problems.append(str(exc))
            self.client = ""
        assert not problems, "; ".join(problems)

    def __enter__(self) -> Network:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
