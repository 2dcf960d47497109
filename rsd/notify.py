"""systemd integration without libsystemd: sd_notify, the watchdog, socket activation.

sd_notify is one datagram per message, ``KEY=VALUE`` lines, sent to the AF_UNIX socket
named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace). rsd sends
READY=1 once it has recovered its journal and listens, RELOADING=1 / READY=1 around a
SIGHUP reload, STOPPING=1 when it begins to stop, and WATCHDOG=1 every half
``$WATCHDOG_USEC`` from a timer of the event loop itself: a loop that is stuck stops
pinging, and systemd restarts rsd.

What always holds:
- without ``$NOTIFY_SOCKET`` nothing is sent and no timer runs; without
  ``$WATCHDOG_USEC`` (or with ``$WATCHDOG_PID`` naming another process) no ping is sent;
- a failing send is logged once and never stops rsd: systemd is an observer;
- a listening socket passed by systemd (``$LISTEN_PID`` is this process and
  ``$LISTEN_FDS`` >= 1) is descriptor 3; the variables are removed once read, so nothing
  rsd starts inherits them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import MutableMapping

__all__ = ["LISTEN_FDS_START", "Notifier", "inherited_listener"]

log = logging.getLogger("rsd")

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START


class Notifier:
    """Messages to systemd's notification socket at ``address`` (None: send nothing)."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        # Pings go out at half the watchdog timeout, as sd_watchdog_enabled(3) advises.
        self.ping_interval = (
            watchdog_usec / 2e6 if address and watchdog_usec and watchdog_usec > 0 else None
        )
        self._sock: socket.socket | None = None
        self._failed = False
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        usec: int | None = None
        watchdog_pid = env.get("WATCHDOG_PID")
        if watchdog_pid is None or watchdog_pid == str(os.getpid()):
            try:
                usec = int(env.get("WATCHDOG_USEC", ""))
            except ValueError:
                usec = None
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send ``fields`` (``KEY=VALUE``) as one message; False if it could not go."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                target = self.address
                if target.startswith("@"):
                    target = "\0" + target[1:]  # the abstract namespace
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.connect(target)
                self._sock = sock
            self._sock.send("\n".join(fields).encode())
            return True
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at %s: %s", self.address, exc)
            self._close_socket()
            return False

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> None:
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self) -> None:
        self.stop_watchdog()
        self.send("STOPPING=1", "STATUS=stopping")

    def start_watchdog(self, loop: asyncio.AbstractEventLoop) -> None:
        """Ping now and then every ``ping_interval`` from ``loop`` (if a watchdog is on)."""
        if self.ping_interval is None:
            return

        def ping() -> None:
            self.send("WATCHDOG=1")
            assert self.ping_interval is not None
            self._timer = loop.call_later(self.ping_interval, ping)

        ping()

    def stop_watchdog(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.stop_watchdog()
        self._close_socket()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def inherited_listener(environ: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed (socket activation), or None."""
    env = os.environ if environ is None else environ
    pid, count = env.pop("LISTEN_PID", None), env.pop("LISTEN_FDS", None)
    env.pop("LISTEN_FDNAMES", None)
    if pid != str(os.getpid()) or not count or not count.isdigit() or int(count) < 1:
        return None
    if int(count) > 1:
        log.warning("systemd passed %s sockets; rsd serves the first only", count)
    sock = socket.socket(fileno=LISTEN_FDS_START)
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        sock.detach()
        raise OSError("the socket systemd passed is not a listening stream socket")
    sock.setblocking(False)
    os.set_inheritable(LISTEN_FDS_START, False)
    return sock
