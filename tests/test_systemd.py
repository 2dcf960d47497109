"""rsd under systemd: the units verify; rsd speaks sd_notify (READY=1 once it has recovered
and listens, WATCHDOG=1 every half WATCHDOG_USEC from its event loop, STOPPING=1 on
SIGTERM) to whatever NOTIFY_SOCKET names, abstract addresses included; and it serves a
listening socket passed by systemd (socket activation)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rsclient import wire
from rsd.notify import Notifier, inherited_listener
from tests.support.process import REPO, Rsd, subprocess_env
from tests.support.raw import raw_connect

UNITS = REPO / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_units_verify(tmp_path: Path) -> None:
    # The unit runs /opt/rsd/venv/bin/rsd, which exists only once installed: verify a
    # copy that runs this checkout's rsd instead, and is otherwise the same file.
    rsd = Path(sys.executable).parent / "rsd"
    service = (UNITS / "rsd.service").read_text()
    assert "ExecStart=/opt/rsd/venv/bin/rsd --config /etc/rsd/rsd.toml" in service
    (tmp_path / "rsd.service").write_text(service.replace("/opt/rsd/venv/bin/rsd", str(rsd)))
    shutil.copy(UNITS / "rsd.socket", tmp_path / "rsd.socket")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "rsd.service", "rsd.socket"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"systemd-analyze verify: {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )


def test_the_service_asks_for_what_rsd_needs_and_nothing_more() -> None:
    lines = set((UNITS / "rsd.service").read_text().splitlines())
    for wanted in (
        "Type=notify", "WatchdogSec=30s", "Restart=on-failure", "StateDirectory=rsd",
        "DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
        "NoNewPrivileges=yes", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet=", "LimitNOFILE=65536", "ExecReload=/bin/kill -HUP $MAINPID",
    ):
        assert wanted in lines, wanted


class NotifySocket:
    """A stand-in for systemd's notification socket."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.address = address
        self.pending: list[dict[str, str]] = []

    def messages(self, timeout: float) -> list[dict[str, str]]:
        """Every message received within ``timeout`` seconds, as KEY -> VALUE."""
        out = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))
        return out

    def wait_for(self, key: str, timeout: float = 10.0) -> dict[str, str]:
        """The first message with ``key``; the ones before it are dropped, the ones
        after it kept for the next call."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pending:
                self.pending.extend(self.messages(0.05))
            while self.pending:
                message = self.pending.pop(0)
                if key in message:
                    return message
        raise AssertionError(f"no {key} within {timeout} s")

    def close(self) -> None:
        self.sock.close()


async def test_rsd_tells_systemd_ready_pings_the_watchdog_and_says_stopping(
    rsds: Callable[..., Rsd], tmp_path: Path
) -> None:
    notify = NotifySocket(str(tmp_path / "notify"))
    server = rsds("notified")
    try:
        env = {"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "200000"}
        await server.start(env=env)
        assert server.proc is not None
        ready = notify.wait_for("READY")
        assert ready["READY"] == "1"
        assert ready["MAINPID"] == str(server.proc.pid)
        assert ready["STATUS"] == f"listening on {server.address}"
        # Pings every 0.1 s (half of WATCHDOG_USEC; the interval's arithmetic is
        # Notifier's own test below): they come, again and again, each a bare WATCHDOG=1.
        # (Not counted in a window of wall time: a loaded machine delays them.)
        pings = [notify.wait_for("WATCHDOG") for _ in range(3)]
        assert all(m == {"WATCHDOG": "1"} for m in pings), pings
        server.hangup()
        assert notify.wait_for("RELOADING")["RELOADING"] == "1"
        assert notify.wait_for("READY")["READY"] == "1"
        server.proc.send_signal(15)
        assert notify.wait_for("STOPPING")["STOPPING"] == "1"
        assert await server.exited(5) == 0
    finally:
        notify.close()


def test_notify_reaches_an_abstract_socket() -> None:
    notify = NotifySocket(f"@rsd-test-{secrets.token_hex(6)}")
    notifier = Notifier(notify.address, watchdog_usec=1_000_000)
    try:
        assert notifier.ping_interval == 0.5
        notifier.ready("listening on test")
        notifier.stopping()
        got = notify.messages(0.2)
        assert got[0]["READY"] == "1" and got[0]["STATUS"] == "listening on test"
        assert got[1]["STOPPING"] == "1"
    finally:
        notifier.close()
        notify.close()


def test_without_systemd_nothing_is_sent_and_no_watchdog_runs() -> None:
    assert not Notifier.from_env({}).enabled
    assert not Notifier.from_env({}).send("READY=1")
    assert Notifier.from_env({"NOTIFY_SOCKET": "/x"}).ping_interval is None
    other = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "100", "WATCHDOG_PID": "1"}
    assert Notifier.from_env(other).ping_interval is None  # the watchdog is another's
    ours = {**other, "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(ours).ping_interval == 0.00005


def test_a_notify_socket_that_is_gone_never_stops_rsd(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"))
    assert notifier.send("READY=1") is False
    assert notifier.send("READY=1") is False


def test_listen_fds_for_another_process_are_ignored() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    assert inherited_listener(env) is None
    assert env == {}  # read once, then removed


async def test_rsd_serves_the_socket_systemd_passes(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    script = (
        f'exec 3<&{listener.fileno()} {listener.fileno()}<&-; '
        'export LISTEN_PID=$$ LISTEN_FDS=1; exec "$@"'
    )
    proc = subprocess.Popen(
        ["bash", "-c", script, "rsd", sys.executable, "-m", "rsd", "--data-dir",
         str(tmp_path / "data"), "--listen", "127.0.0.1:1"],
        pass_fds=(listener.fileno(),), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env(), cwd=REPO,
    )
    listener.close()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        assert line == f"rsd listening on 127.0.0.1:{port}"
        conn = await raw_connect(f"127.0.0.1:{port}")
        reply = await conn.ok(wire.Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": "t"})
        assert reply["version"] == wire.PROTOCOL_VERSION
        conn.writer.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()
    assert b"serving the socket systemd passed" in err
