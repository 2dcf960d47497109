"""The partition tests' network (support/netns.py) does what they rely on: a cut drops
the packets it names and no others, silently (a connect times out, as across a broken
wire, never refused nor failed at once), until it heals; and nothing of a network
outlives its test: ``close`` removes it, and what a killed run left (namespaces with
their processes, the bridge) is swept by the next. Skipped, saying why, where network
namespaces cannot be made.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import netns
from support.netns import Host, Network
from support.process import subprocess_env

PORT = 7420  # the listener's, in host b (a namespace of its own: nothing else binds it)
OTHER = 7421
_LISTEN = ("import socket, sys\n"
           "server = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
           "print('ready', flush=True)\n"
           "while True:\n"
           "    server.accept()[0].close()\n")
_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5).close()\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__, exc)\n")


def _connect(host: Host, address: str, port: int = PORT) -> str:
    """What a TCP connect from ``host`` to ``address:port`` met: ``connected``, or the
    error (``TimeoutError ...`` when every packet was dropped)."""
    done = subprocess.run(host.command(sys.executable, "-c", _CONNECT, address, str(port)),
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


@pytest.fixture
def network() -> Iterator[Network]:
    """Hosts ``a`` and ``b``, a listener on ``b``'s port ``PORT``."""
    netns.require()
    with Network(["a", "b"]) as net:
        listener = subprocess.Popen(
            net["b"].command(sys.executable, "-c", _LISTEN, net["b"].address, str(PORT)),
            stdout=subprocess.PIPE, text=True)
        try:
            assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
            yield net
        finally:
            listener.kill()
            listener.wait()


def test_a_cut_drops_what_it_names_silently_until_it_heals(network: Network) -> None:
    a, b = network["a"], network["b"]
    assert _connect(a, b.address) == "connected"

    b.block(a.address)  # both ways
    assert _connect(a, b.address).startswith("TimeoutError")
    with socket.socket() as bound:  # bound, not listening: a connect to it is refused
        bound.bind((network.client, 0))
        assert _connect(a, network.client, bound.getsockname()[1]).startswith(
            "ConnectionRefused"), "a cut of b dropped a's packets to the root namespace"
    b.heal()
    assert _connect(a, b.address) == "connected"

    b.block(a.address, inbound=False)  # b's packets to a: the SYN-ACK is lost
    assert _connect(a, b.address).startswith("TimeoutError")
    b.heal()

    b.block(a.address, outbound=False, port=OTHER)  # a's packets to b's other port only
    assert _connect(a, b.address) == "connected"
    assert _connect(a, b.address, OTHER).startswith("TimeoutError")
    b.heal()

    b.isolate()
    assert _connect(a, b.address).startswith("TimeoutError")
    network.heal()
    assert _connect(a, b.address) == "connected"


_ABANDON = ("import sys, subprocess\n"
            "from support.netns import Network\n"
            "net = Network(['a']).start()\n"
            "subprocess.Popen(net['a'].command('sleep', '600'))\n"
            "print(net.bridge, net['a'].netns, flush=True)\n"
            "sys.stdin.read()\n")


def _names() -> str:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return listed + links


def _pids(namespace: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                          text=True).stdout.split()


def test_what_a_killed_run_left_is_swept_by_the_next(tmp_path: Path) -> None:
    netns.require()
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
    run = subprocess.Popen([sys.executable, "-c", _ABANDON], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env)
    assert run.stdout is not None
    bridge, namespace = run.stdout.readline().split()
    # `ip netns exec` enters the namespace after its fork: the process is seen there a
    # moment after Popen returned (later still on a loaded machine).
    deadline = time.monotonic() + 30
    while not (pids := _pids(namespace)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids, "the run's process in its namespace did not start"
    run.send_signal(signal.SIGKILL)  # no close: its names stay
    run.wait()

    netns.sweep()  # (another worker's new Network may have swept them first: as well)
    assert bridge not in _names() and namespace not in _names()
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), (
        "the killed run's process in its namespace was left running")


def test_a_closed_network_leaves_nothing_behind() -> None:
    netns.require()
    with Network(["a"]) as net:
        names = [net.bridge, net["a"].netns]
        assert all(name in _names() for name in names)
    assert not any(name in _names() for name in names)
