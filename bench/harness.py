"""Shared benchmark plumbing: start a throwaway rsd on a free port, stop it after.

``rsd_process`` yields the running server as an ``RsdProcess`` (address, pid, data
directory), for benchmarks that watch the process itself (its memory, its exit);
``rsd_server`` yields only its address, or the address given. ``throwaway_tls`` makes a
CA and a certificate for 127.0.0.1 (trustme, from the test extra) and points this
process's default TLS trust (``SSL_CERT_FILE``, inherited by child processes) at the CA,
so ``tls://`` addresses verify against it: for measuring what TLS costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "RsdProcess", "cpu_seconds", "rsd_process", "rsd_server", "rss_bytes", "start_rsd",
    "stop_rsd", "throwaway_tls",
]


def rss_bytes(pid: int) -> int | None:
    """The resident set size (VmRSS) of process ``pid``, None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` has used so far (user + system, from /proc), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class RsdProcess:
    """A running rsd started by this harness."""

    address: str
    proc: asyncio.subprocess.Process
    data_dir: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """CPU time the rsd process has used so far (user + system), in seconds."""
        return cpu_seconds(self.pid)

    def rss_bytes(self) -> int | None:
        """The resident set size of the rsd process (VmRSS), None once it has exited."""
        return rss_bytes(self.pid)


async def start_rsd(
    data_dir: Path, *extra: str, ready_timeout: float = 300.0,
    stderr: int | IO[Any] | None = None, test_only: bool = False,
) -> RsdProcess:
    """Start rsd on ``data_dir`` and a free port; RuntimeError if it does not get ready
    (it exited, or printed something else first) within ``ready_timeout``.
    ``test_only``: ``extra`` holds a test-only option (RSD_TEST_ONLY_OPTIONS=1)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if test_only:
        env["RSD_TEST_ONLY_OPTIONS"] = "1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rsd", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
        "--log-level", "WARNING", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), ready_timeout)).decode()
    except TimeoutError:
        await stop_rsd(proc)
        raise RuntimeError(f"rsd not ready within {ready_timeout} s") from None
    if not line.startswith("rsd listening on "):
        code = await stop_rsd(proc)
        raise RuntimeError(f"rsd did not start (exit {code}): {line!r}")
    address = line.strip().removeprefix("rsd listening on ")
    return RsdProcess(address, proc, data_dir)


async def stop_rsd(proc: asyncio.subprocess.Process, timeout: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout``; the exit code (negative: a signal)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode


@contextlib.asynccontextmanager
async def rsd_process(
    *extra: str, ready_timeout: float = 300.0, stderr: IO[Any] | None = None,
    test_only: bool = False,
) -> AsyncIterator[RsdProcess]:
    """A fresh rsd on a temporary data directory, stopped (SIGTERM) and removed after."""
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as data:
        server = await start_rsd(Path(data), *extra, ready_timeout=ready_timeout,
                                 stderr=stderr, test_only=test_only)
        try:
            yield server
        finally:
            await stop_rsd(server.proc)


@contextlib.asynccontextmanager
async def rsd_server(
    address: str | None = None, *extra: str, ready_timeout: float = 300.0
) -> AsyncIterator[str]:
    """Yield the address of a running rsd: ``address`` as given, or a fresh one.

    ``ready_timeout`` covers recovery of a large data directory given in ``extra``.
    """
    if address:
        yield address
        return
    async with rsd_process(*extra, ready_timeout=ready_timeout) as server:
        yield server.address


@contextlib.contextmanager
def throwaway_tls() -> Iterator[list[str]]:
    """rsd's TLS flags for a fresh certificate of 127.0.0.1, trusted by this process (and
    its children) for as long as the block runs."""
    import trustme

    with tempfile.TemporaryDirectory(prefix="rsd-bench-tls-") as where:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        ca_file, cert_file, key_file = (Path(where) / n for n in ("ca.pem", "c.pem", "k.pem"))
        ca.cert_pem.write_to_path(str(ca_file))
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        before = os.environ.get("SSL_CERT_FILE")
        os.environ["SSL_CERT_FILE"] = str(ca_file)
        try:
            yield ["--tls-cert", str(cert_file), "--tls-key", str(key_file)]
        finally:
            if before is None:
                os.environ.pop("SSL_CERT_FILE", None)
            else:
                os.environ["SSL_CERT_FILE"] = before


def forked_clients(target: Any, per_child: list[tuple[Any, ...]], what: str) -> list[Any]:
    """A peer's client processes at their best (docs/benchmarks.md, "The peers at their best"): one
    child forked from this process per item of ``per_child`` (``target(*item, ready,
    window, results)``: what it needs was imported here once, before the fork). Prints
    READY once every child is connected (each puts on ``ready``), reads the measurement
    window (two numbers) on stdin and hands it to each child (``window``), and returns
    what each put on ``results``; a child that exits badly ends this process."""
    import multiprocessing

    forks = multiprocessing.get_context("fork")
    ready, window, results = forks.Queue(), forks.Queue(), forks.Queue()
    children = [forks.Process(target=target, args=(*item, ready, window, results))
                for item in per_child]
    for child in children:
        child.start()
    for _ in children:
        ready.get()
    print("READY", flush=True)
    first, second = (float(at) for at in sys.stdin.readline().split())
    for _ in children:
        window.put((first, second))
    done = [results.get() for _ in children]
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"{what} exited with {child.exitcode}")
    return done


async def launched_clients(module: str, args: list[str], window: Callable[[float], str],
                           what: str, opened: Callable[[], None] | None = None) -> bytes:
    """The parent's half of ``forked_clients``: start ``python -m module *args``, wait for
    its READY (every child connected), call ``opened`` (what is measured around the
    window starts now), hand it the window ``window(start)`` (start: 50 ms ahead, so every
    child has it before it opens) and return what it printed; its failure is an error
    naming ``what``."""
    launcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert launcher.stdout is not None
    try:
        if (await launcher.stdout.readline()).strip() != b"READY":
            raise RuntimeError(f"the {what} bench processes did not connect")
        if opened is not None:
            opened()
        start = time.time() + 0.05
        out, _ = await launcher.communicate(window(start).encode())
    finally:
        if launcher.returncode is None:
            launcher.kill()
            await launcher.wait()
    if launcher.returncode != 0:
        raise RuntimeError(f"the {what} bench processes exited with {launcher.returncode}")
    return out
