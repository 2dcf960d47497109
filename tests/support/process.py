"""Real rsd processes for the integration tests: one class for every way a test drives one.

An ``Rsd`` owns one data directory. Each start runs ``python -m rsd`` on it as a new
process (``--handshake-timeout 1``), logging to a file of its own (``rsd-<n>.log``), and
is ready when it prints ``rsd listening on HOST:PORT``. The first start binds port 0
(``port`` other than 0 only to meet a port a test holds) and the port is read from that
line; every later start binds the port the last one reported (rsd listens with
SO_REUSEADDR, so a port left in TIME_WAIT binds again), so a client finds the restarted
server at the same address. No test picks a free port for rsd to bind later: another
process could take it in between ("address already in use" on a loaded machine). A test
that needs an address where nothing listens holds one (``refusing_address``).
Authentication and TLS are flags like any other (``--tokens-file``, ``--tls-cert``, ...):
``write_tokens`` writes a tokens file beside the data directory, ``hup`` sends SIGHUP to
reload it, and ``listen_host`` serves another address than 127.0.0.1. With ``netns``
each start runs in that network namespace of a partition test (support/netns.py's
``host.netns``): forked into it (support/forkserver.py: the child joins it), or as
``ip netns exec NAME python -m rsd ...`` (which execs rsd, so signals reach it).

A test that waits out a lease (a holder killed, a lease let lapse) starts its server with
``*SHORT_LEASES`` (``--test-min-lease-seconds``) and asks for ``SHORT_LEASE`` seconds: a
lapse takes one second, not the protocol's five. The children's environment allows that
test-only flag (``RSD_TEST_ONLY_OPTIONS=1``); without the flag a server is as shipped.
A test that times a takeover (a holder killed or paused while the SDK renews its lease,
a window like "granted 1.8 to 5.0 s after the kill") asks for ``TAKEOVER_LEASE`` seconds
on such a server (``@pytest.mark.rsd_flags(*SHORT_LEASES)``, tests/conftest.py).

Every child Python keeps its bytecode (``bytecode_cache``): where the environment says
not to write it (PYTHONDONTWRITEBYTECODE), each rsd start compiled every module of rsd
anew, 0.34 s of CPU per start instead of 0.18 s, hundreds of times a run; the cache then
goes to ``build/pycache`` (PYTHONPYCACHEPREFIX), not beside the sources.

Everything has a blocking form (for fixtures, which run outside the test's event loop) and
an ``async`` form (for tests that run several servers at once). Processes are plain
``subprocess.Popen`` children, never asyncio ones: a server started ahead of need in one
test's event loop can then be used from the next test's loop, and signals never race an
asyncio child watcher for an exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .forkserver import ForkedProcess, fork_server

REPO = Path(__file__).resolve().parent.parent.parent
HELPERS = Path(__file__).resolve().parent.parent / "helpers"
READY_TIMEOUT = 15.0  # seconds for rsd to print its listening line (several start at once)
STOP_TIMEOUT = 5.0  # seconds for rsd to exit after SIGTERM
POLL = 0.01  # seconds between checks while an async caller waits for an exit
KILLED = -signal.SIGKILL  # the exit code of a process ended by SIGKILL
BYTECODE_CACHE = REPO / "build" / "pycache"  # where bytecode goes if not beside the sources
NETNS_RUN_DIR = Path("/run/netns")  # where ``ip netns`` keeps the namespaces it names
_READY = re.compile(rb"^rsd listening on (\S+):(\d+)$")
# The lease a test waits out, and the flags that let its server grant one that short.
SHORT_LEASE = 1.0
SHORT_LEASES = ("--test-min-lease-seconds", f"{SHORT_LEASE:g}")
# The lease of a takeover timed in real time, 3 s instead of the protocol's shortest 5 s:
# the SDK renews it every second (a third) and declares it lost 2 s after the send of the
# last confirmed renewal (rsproto.sdkrules.loss_margin: 1 s), so a renewal's round trip
# still has a second to come back on a loaded machine (a 2 s lease would leave a third
# of one: a holder that loses its lease early frees the key early).
TAKEOVER_LEASE = 3.0


def bytecode_cache(env: dict[str, str] | os._Environ[str]) -> None:
    """Let the Python processes started with ``env`` keep the bytecode they compile: in
    ``BYTECODE_CACHE`` if ``env`` forbade writing it (a compile per import costs every
    rsd start and every pytest-xdist worker's collection more CPU than the rest of it)."""
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        env.setdefault("PYTHONPYCACHEPREFIX", str(BYTECODE_CACHE))


def subprocess_env() -> dict[str, str]:
    """The environment for child Python processes: the repo importable, output unbuffered,
    bytecode kept (``bytecode_cache``)."""
    env = dict(os.environ)
    bytecode_cache(env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["RSD_TEST_ONLY_OPTIONS"] = "1"  # (rsd.options.TEST_ONLY_ENVIRONMENT) SHORT_LEASES
    env.pop("RUNSTATE_ADDRESS", None)
    env.pop("RUNSTATE_TOKEN", None)
    return env


@contextlib.contextmanager
def refusing_address() -> Iterator[str]:
    """``HOST:PORT`` where nothing listens and nothing can start to while the block runs:
    the port is bound (not listening, without SO_REUSEADDR, so no other socket can bind
    it), and a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


_METRICS_AT = re.compile(r"metrics at https?://(?:\[[^\]]+\]|[^:/\s]+):(\d+)/metrics")


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Rsd:
    """One data directory (``root / "data"``), started, paused, stopped and crashed at will.

    ``address`` is the listening address of the last start; ``proc`` the last process.
    """

    def __init__(self, root: Path, port: int = 0, listen_host: str = "127.0.0.1",
                 netns: str | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.listen_host = listen_host
        self.netns = netns
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.logs: list[Path] = []
        self._stdout = b""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"<rsd pid={pid} at {self.address}>"

    # ---- starting ----------------------------------------------------------------------

    def spawn(
        self, *extra: str, failpoints: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start a process without waiting for it to listen (see ``ready``/``started``);
        ``env`` adds to its environment."""
        self.root.mkdir(parents=True, exist_ok=True)
        common = subprocess_env()
        child_env = dict(common)
        if failpoints:
            child_env["RSD_FAILPOINTS"] = failpoints
        child_env.update(env or {})
        log_path = self.root / f"rsd-{len(self.logs)}.log"
        self.logs.append(log_path)
        self._stdout = b""
        args = [
            "--listen", f"{self.listen_host}:{self.port}",
            "--data-dir", str(self.data),
            "--handshake-timeout", "1",
            *extra,
        ]
        server = fork_server(sys.executable, str(REPO), common, child_env)
        netns = None if self.netns is None else str(NETNS_RUN_DIR / self.netns)
        with open(log_path, "wb") as log_file:  # the child holds its own copy
            if server is not None:
                self.proc = server.spawn(args, child_env, log_file, netns=netns)
                return
            wrap = [] if self.netns is None else ["ip", "netns", "exec", self.netns]
            self.proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", "rsd", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
                cwd=REPO,
                env=child_env,
            )

    def _take_output(self) -> bool:
        """Read what stdout has; False at EOF."""
        assert self.proc is not None and self.proc.stdout is not None
        chunk = os.read(self.proc.stdout.fileno(), 4096)
        self._stdout += chunk
        return bool(chunk)

    def _listening(self, line: bytes) -> str:
        match = _READY.match(line.strip())
        if match is None:
            self._kill_now()
            pytest.fail(f"rsd did not start (exit {self.proc and self.proc.returncode}, "
                        f"said {line!r}); log:\n{self.log()}")
        self.host, self.port = match.group(1).decode(), int(match.group(2))
        return self.address

    def ready(self, timeout: float = READY_TIMEOUT) -> str:
        """Block until the listening line; the address (the test fails if it never comes)."""
        return self._listening(self._first_line(timeout))

    def _first_line(self, timeout: float) -> bytes:
        """Block for the first line of stdout, or what came before EOF or the timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._stdout:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select([self.proc.stdout.fileno()], [], [], left)
            if readable and not self._take_output():
                break
        return self._stdout.split(b"\n", 1)[0]

    async def _line(self, timeout: float) -> bytes:
        """The first line of stdout, or what came before EOF or the timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        fd = self.proc.stdout.fileno()
        deadline = loop.time() + timeout
        while b"\n" not in self._stdout and loop.time() < deadline:
            readable = loop.create_future()
            loop.add_reader(fd, _settle, readable)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(readable, deadline - loop.time())
            finally:
                loop.remove_reader(fd)
            if readable.done() and not self._take_output():
                break
        return self._stdout.split(b"\n", 1)[0]

    async def started(self, timeout: float = READY_TIMEOUT) -> str:
        """``ready`` for a coroutine: other tasks run while this server starts."""
        return self._listening(await self._line(timeout))

    def _port_taken_meanwhile(self, line: bytes, deadline: float) -> bool:
        """Whether a start again on the port of the last one (``port`` set) found it taken
        by another socket, with time left to try again. Between a kill and the restart,
        the kernel may give that port to any outgoing connection on the machine as its
        ephemeral local port (rsd's listening port came from the same range); SO_REUSEADDR
        does not cover a bound socket, so the restart waits for that connection to end,
        as an operator would."""
        if line or not self.port or time.monotonic() >= deadline:
            return False
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT)
        return self.proc.returncode is not None and "address already in use" in self.log()

    def start_now(self, *extra: str, failpoints: str | None = None) -> str:
        """Spawn and block until listening; the address."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            self.spawn(*extra, failpoints=failpoints)
            line = self._first_line(READY_TIMEOUT)
            if not self._port_taken_meanwhile(line, deadline):
                return self._listening(line)
            time.sleep(0.25)

    async def start(
        self, *extra: str, failpoints: str | None = None, env: dict[str, str] | None = None
    ) -> str:
        """Spawn and wait until listening; the address."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            self.spawn(*extra, failpoints=failpoints, env=env)
            line = await self._line(READY_TIMEOUT)
            if not self._port_taken_meanwhile(line, deadline):
                return self._listening(line)
            await asyncio.sleep(0.25)

    async def refused(self, *extra: str) -> int:
        """Start, expecting rsd to exit before listening; returns its exit code."""
        self.spawn(*extra)
        line = await self._line(READY_TIMEOUT)
        assert line == b"", f"rsd started although it should have refused: {line!r}"
        return await self.exited(READY_TIMEOUT)

    async def restart(self, *extra: str) -> str:
        """SIGTERM (it must exit 0), then start again on the same data directory."""
        assert await self.stop() == 0, f"{self} did not stop cleanly; log:\n{self.log()}"
        return await self.start(*extra)

    # ---- signals and exits -------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def hup(self) -> None:
        """SIGHUP: reload the tokens file and the TLS certificate."""
        self._signal(signal.SIGHUP)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections; nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def hangup(self) -> None:
        """SIGHUP: reload the config file."""
        self._signal(signal.SIGHUP)

    async def exited(self, timeout: float | None = None) -> int:
        """Wait for the process to end on its own; its exit code (TimeoutError if not)."""
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while (code := self.proc.poll()) is None:
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"{self} still running after {timeout} s")
            await asyncio.sleep(POLL)
        self._close_stdout()
        return code

    def _close_stdout(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def _kill_now(self) -> int:
        assert self.proc is not None
        self._signal(signal.SIGKILL)
        code = self.proc.wait()
        self._close_stdout()
        return code

    async def kill(self) -> int:
        """SIGKILL; the exit code (``KILLED`` unless it had already exited)."""
        self._signal(signal.SIGKILL)
        return await self.exited()

    async def stop(self) -> int:
        """SIGTERM (after SIGCONT: a paused server cannot handle it); the exit code.
        rsd must exit within STOP_TIMEOUT."""
        self.resume()
        self._signal(signal.SIGTERM)
        try:
            return await self.exited(STOP_TIMEOUT)
        except TimeoutError:
            await self.kill()
            raise AssertionError(f"rsd did not exit within {STOP_TIMEOUT} s of SIGTERM") from None

    def stop_now(self) -> int | None:
        """``stop`` for a fixture: blocks; the exit code, or None if it had to be killed."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.resume()
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._kill_now()
                return None
        self._close_stdout()
        return self.proc.returncode

    # ---- what it left behind -------------------------------------------------------------

    def metrics_port(self) -> int:
        """The port of the metrics endpoint (``--metrics-listen HOST:0``), as the last
        start logged it before its listening line."""
        found = _METRICS_AT.findall(self.log())
        assert found, f"no metrics endpoint in the log:\n{self.log()}"
        return int(found[-1])

    def write_tokens(self, *lines: str) -> Path:
        """Write (or rewrite) the tokens file ``root / "tokens"``; its path, for
        ``--tokens-file``."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "tokens"
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    def log(self, n: int = -1) -> str:
        """The log of the ``n``-th start (the last by default)."""
        return self.logs[n].read_text(errors="replace")

    def tracebacks(self) -> list[str]:
        """The logs of every start that hold a traceback (a server bug), with their text."""
        texts = [(path, path.read_text(errors="replace")) for path in self.logs]
        return [f"{path}:\n{text}" for path, text in texts if "Traceback" in text]

    def segments(self) -> list[Path]:
        return sorted(self.data.glob("journal-*.log"))
