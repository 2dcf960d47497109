"""The peers a user would pick instead of rsd: a Redis and a beanstalkd of their own.

``find_peers`` looks for ``redis-server`` and ``beanstalkd`` and, when one is missing,
installs both from Debian's packages (``apt-get install -y redis-server beanstalkd``, as
root); when that cannot be done it says how to install them and the peer is skipped, it
never fails the run. ``redis_server`` / ``beanstalkd_server`` start one on a free
loopback port with a temporary directory of its own, and stop it (and remove the
directory) after. Durability is matched to rsd's ``--fsync``: ``durable=False`` is Redis
without persistence (``--save '' --appendonly no``) and beanstalkd without ``-b``;
``durable=True`` is Redis ``--appendonly yes --appendfsync always`` and beanstalkd
``-b DIR -f 0`` (an fsync on every write).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from bench.harness import rss_bytes

__all__ = ["PeerProcess", "beanstalkd_server", "find_peers", "free_port", "redis_server"]

PACKAGES = {"redis": ("redis-server", "redis-server"), "beanstalkd": ("beanstalkd", "beanstalkd")}
HOW_TO_INSTALL = "apt-get install -y redis-server beanstalkd (as root), then pip install '.[bench]'"


@dataclass
class PeerProcess:
    """A running peer: its loopback port and process."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]

    def rss_bytes(self) -> int | None:
        """The peer process's resident set size (VmRSS), None once it has exited."""
        return rss_bytes(self.proc.pid)


def _client_library(name: str) -> bool:
    module = {"redis": "redis", "beanstalkd": "greenstalk"}[name]
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _apt_install(say: Callable[[str], None]) -> None:
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        say("apt-get is not available here (or we are not root)")
        return
    packages = [package for _, package in PACKAGES.values()]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in (["apt-get", "install", "-y", *packages], ["apt-get", "update"],
                    ["apt-get", "install", "-y", *packages]):
        say("running " + " ".join(attempt))
        done = subprocess.run(attempt, env=env, capture_output=True, text=True, check=False)
        if attempt[1] == "install" and done.returncode == 0:
            return
        if done.returncode != 0:
            say(f"{' '.join(attempt[:2])} failed: {done.stderr.strip()[-300:]}")


def find_peers(say: Callable[[str], None]) -> dict[str, str]:
    """Peer name -> its server binary, for each peer that can run here (installing the
    Debian packages when one is missing); each peer left out is explained through ``say``."""
    if any(shutil.which(binary) is None for binary, _ in PACKAGES.values()):
        _apt_install(say)
    found: dict[str, str] = {}
    for name, (binary, _) in PACKAGES.items():
        path = shutil.which(binary)
        if path is None:
            say(f"{binary} not found: skipping {name}; to include it: {HOW_TO_INSTALL}")
        elif not _client_library(name):
            say(f"the Python client for {name} is missing: skipping it; {HOW_TO_INSTALL}")
        else:
            found[name] = path
    return found


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _until_listening(proc: subprocess.Popen[bytes], port: int, name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within 10 s")


@contextlib.asynccontextmanager
async def _peer(name: str, argv: Callable[[int, str], list[str]]) -> AsyncIterator[PeerProcess]:
    with tempfile.TemporaryDirectory(prefix=f"rsd-bench-{name}-") as where:
        port = free_port()
        proc = subprocess.Popen(argv(port, where), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=where)
        try:
            await _until_listening(proc, port, name)
            yield PeerProcess(name, port, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def redis_server(binary: str, durable: bool) -> contextlib.AbstractAsyncContextManager[PeerProcess]:
    """A fresh Redis: no persistence, or an append-only file fsynced on every write."""
    persistence = (["--appendonly", "yes", "--appendfsync", "always"] if durable
                   else ["--appendonly", "no"])

    def argv(port: int, where: str) -> list[str]:
        return [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", where,
                "--save", "", *persistence, "--daemonize", "no", "--loglevel", "warning"]

    return _peer("redis", argv)


def beanstalkd_server(
    binary: str, durable: bool
) -> contextlib.AbstractAsyncContextManager[PeerProcess]:
    """A fresh beanstalkd: in memory only, or a binlog fsynced on every write (-f 0)."""

    def argv(port: int, where: str) -> list[str]:
        return [binary, "-l", "127.0.0.1", "-p", str(port),
                *(["-b", where, "-f", "0"] if durable else [])]

    return _peer("beanstalkd", argv)
